"""Tables and figure of the precision dose study, from its archived runs (docs/study/dose/runs).

Per run: the study summary (`analysis.summarize`: accuracy endpoints BF16-scored, `prob_nmae`,
`ratio_nmae`, `ratio_compounding`, the lower-bound clip share of A<0 tokens, entropy), plus the
upper-bound clip share of A>0 tokens (`clip_upper_frac_pos`, mean over steps), the entropy's mean
over 25-step windows, whether its largest rise reaches the pre-registered threshold, and pass@k
(`dose_passk.json`). Per arm: means with Student-t 95 % intervals over seeds (n beside each).
Per format: loss = uncalibrated − BF16 and recovery = calibrated − uncalibrated, each the
Student-t interval of the per-seed differences over the seeds both arms have (paired, n).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from nemo_fp8_rl.study import analysis, endpoints
from nemo_fp8_rl.study.doc_blocks import write_blocks
from nemo_fp8_rl.study.dose import ARCHIVE, DOCS, arm_name

WINDOW = 25
ENDPOINTS = (
    ("val_gain", "accuracy gain from step 0", "{:+.3f}"),
    ("val_mean", "accuracy, mean after step 0", "{:.3f}"),
    ("pass@1", "pass@1", "{:.3f}"),
    ("pass@4", "pass@4", "{:.3f}"),
    ("pass@16", "pass@16", "{:.3f}"),
    ("clip_lower_frac_neg", "A<0 clipped at L", "{:.4f}"),
    ("clip_upper_frac_pos", "A>0 clipped at H", "{:.4f}"),
    ("entropy_mean", "mean entropy", "{:.3f}"),
    ("entropy_rise", "largest entropy rise", "{:.3f}"),
)
DOSE = (
    ("prob_nmae", "prob NMAE", "{:.4f}"),
    ("ratio_nmae", "ratio NMAE (the dose)", "{:.4f}"),
    ("ratio_compounding", "compounding", "{:.2f}"),
)


def summarize(run_dir: Path, threshold: float | None) -> dict[str, float]:
    """One run's values (module doc)."""
    s = analysis.summarize(run_dir)
    recs = analysis.read_records(run_dir)
    train = [r for r in recs if r["step"] >= 1 and r.get("train/entropy") is not None]
    ups = [r["train/clip_upper_frac_pos"] for r in train if "train/clip_upper_frac_pos" in r]
    s["clip_upper_frac_pos"] = sum(ups) / len(ups) if ups else math.nan
    s["surge"] = float(threshold is not None and s["entropy_rise"] >= threshold)
    for w in range(0, max((r["step"] for r in train), default=0), WINDOW):
        vals = [r["train/entropy"] for r in train if w < r["step"] <= w + WINDOW]
        s[f"entropy_w{w + WINDOW}"] = sum(vals) / len(vals) if vals else math.nan
    passk = run_dir / "dose_passk.json"
    if passk.exists():
        for k, v in json.loads(passk.read_text())["pass_at_k"].items():
            s[f"pass@{k}"] = v
    return s


def arm_list() -> list[str]:
    """Arm names in report order: BF16, then each format uncalibrated and calibrated."""
    formats = endpoints.load().dose.formats
    return ["bf16"] + [a for f in formats for a in (f"{f}-uncalibrated", f)]


def collect(archive: Path = ARCHIVE) -> dict[str, dict[int, dict]]:
    """`{arm: {seed: summary}}` of the archived runs (arms without runs are left out)."""
    threshold = endpoints.load().dose.entropy_surge.threshold
    out: dict[str, dict[int, dict]] = {}
    for arm in arm_list():
        runs = sorted((archive / arm_name(arm)).glob("seed-*"))
        if runs:
            out[arm] = {int(r.name[5:]): summarize(r, threshold) for r in runs}
    return out


def arm_interval(runs: dict[int, dict], key: str) -> analysis.Interval:
    """Mean of `key` over an arm's seeds with its Student-t 95 % interval (n)."""
    return analysis.mean_interval([s.get(key, math.nan) for s in runs.values()])


def paired_diff(a: dict[int, dict], b: dict[int, dict], key: str) -> analysis.Interval:
    """a − b over the seeds both have (Student-t of the per-seed differences)."""
    return analysis.paired(
        {k: s.get(key, math.nan) for k, s in a.items()},
        {k: s.get(key, math.nan) for k, s in b.items()},
        "diff",
    )


def arm_table(table: dict[str, dict[int, dict]]) -> str:
    """Per arm: seeds, the dose, every endpoint (mean [95 % t-interval] (n))."""
    cols = [*DOSE, *ENDPOINTS]
    lines = [
        "| arm | seeds | surges | " + " | ".join(label for _, label, _ in cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for arm, runs in table.items():
        cells = " | ".join(arm_interval(runs, k).fmt(f) for k, _, f in cols)
        surges = f"{int(sum(s['surge'] for s in runs.values()))}/{len(runs)}"
        lines.append(f"| {arm} | {', '.join(map(str, sorted(runs)))} | {surges} | {cells} |")
    return "\n".join(lines)


def format_table(table: dict[str, dict[int, dict]]) -> str:
    """Per format: the dose, what uncalibrated loses against BF16 and what calibration recovers,
    on the primary endpoint, pass@16 and the lower-bound clip share (paired, n)."""
    keys = (("val_gain", "{:+.3f}"), ("pass@16", "{:+.3f}"), ("clip_lower_frac_neg", "{:+.4f}"))
    head = " | ".join(f"{what} {k}" for k, _ in keys for what in ("loss", "recovery"))
    lines = [f"| format | dose (ratio NMAE, uncalibrated) | {head} |", "|---|---|" + "---|" * 6]
    base = table.get("bf16", {})
    for fmt in endpoints.load().dose.formats:
        unc, cal = table.get(f"{fmt}-uncalibrated"), table.get(fmt)
        if not unc:
            continue
        cells = []
        for k, f in keys:
            cells.append(paired_diff(unc, base, k).fmt(f) if base else "—")
            cells.append(paired_diff(cal, unc, k).fmt(f) if cal else "—")
        lines.append(
            f"| {fmt} | {arm_interval(unc, 'ratio_nmae').fmt('{:.4f}')} | {' | '.join(cells)} |"
        )
    return "\n".join(lines)


def entropy_table(table: dict[str, dict[int, dict]]) -> str:
    """Mean entropy per 25-step window, per arm (mean over seeds, n)."""
    keys = sorted(
        {
            k
            for runs in table.values()
            for s in runs.values()
            for k in s
            if k.startswith("entropy_w")
        },
        key=lambda k: int(k[9:]),
    )
    lines = [
        "| arm | " + " | ".join(f"steps {int(k[9:]) - WINDOW + 1}-{k[9:]}" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for arm, runs in table.items():
        lines.append(f"| {arm} | " + " | ".join(arm_interval(runs, k).fmt() for k in keys) + " |")
    return "\n".join(lines)


def markdown(archive: Path = ARCHIVE) -> str:
    """The three tables, with the threshold in force."""
    table = collect(archive)
    thr = endpoints.load().dose.entropy_surge.threshold
    return "\n\n".join(
        [
            "Per arm (mean [95 % Student-t interval] (n seeds)); surges: runs whose largest "
            f"entropy rise reaches the pre-registered threshold {thr}:",
            arm_table(table),
            "Per format, paired by seed (Student-t of the per-seed differences, n): loss = "
            "uncalibrated − BF16, recovery = calibrated − uncalibrated:",
            format_table(table),
            "Entropy over training, mean per 25-step window:",
            entropy_table(table),
        ]
    )


def figures(archive: Path = ARCHIVE, out: Path = DOCS) -> list[Path]:
    """The paired differences the verdict rests on, against each format's measured dose: loss
    (uncalibrated − BF16) and recovery (calibrated − uncalibrated) of the accuracy gain, each
    the mean of per-seed differences with its Student-t 95 % interval (n); the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nemo_fp8_rl.config.safe_files import write_atomic_with

    table = collect(archive)
    base = table.get("bf16", {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    panels = (("loss: uncalibrated − BF16", "-uncalibrated", None),
              ("recovery: calibrated − uncalibrated", "", "-uncalibrated"))  # fmt: skip
    for ax, (title, arm_suffix, ref_suffix) in zip(axes, panels, strict=True):
        for fmt in endpoints.load().dose.formats:
            arm = table.get(f"{fmt}{arm_suffix}")
            ref = base if ref_suffix is None else table.get(f"{fmt}{ref_suffix}")
            unc = table.get(f"{fmt}-uncalibrated")
            if not arm or not ref or not unc:
                continue
            y = paired_diff(arm, ref, "val_gain")
            x = arm_interval(unc, "ratio_nmae").mean
            err = [[y.mean - y.low], [y.high - y.mean]] if math.isfinite(y.low) else None
            ax.errorbar([x], [y.mean], yerr=err, fmt="o", capsize=3, label=f"{fmt} (n={y.n})")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("measured dose: ratio NMAE against the BF16 shadow (uncalibrated arm)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("difference in accuracy gain from step 0 (BF16-scored)")
    fig.suptitle("Precision dose study: paired differences by seed (95 % Student-t intervals)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "dose_response.png"
    write_atomic_with(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return [path]


PAGE = DOCS.parent / "dose.md"
TABLES = ("<!-- dose-tables:begin -->", "<!-- dose-tables:end -->")
VERDICT = ("<!-- dose-verdict:begin -->", "<!-- dose-verdict:end -->")


def write_docs(tables: str, verdict: str, page: Path = PAGE) -> None:
    """Write docs/study/dose.md's generated blocks, the tables and the verdict (README's two
    sentences are `scripts/readme_evidence.py`'s), in one write once both blocks are replaced:
    a page missing either pair of markers is left as it was."""
    write_blocks(page, {TABLES: tables, VERDICT: verdict})
