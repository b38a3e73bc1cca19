"""The study's report: a Markdown table of targets with 95 % intervals, and PNG plots.

Three recipes play fixed roles: `bf16` (reference), `fp8_uncal` (FP8 with the nominal bounds)
and `fp8_cal` (FP8 with Calibrated Clipping). Targets (each over seeds, 95 % intervals):
1. ratio amplification of `fp8_uncal` ≥ 1.5;
2. `fp8_uncal` clips ≥ 2× `bf16`'s share of negative-advantage tokens at the lower bound
   (per-seed quotient of the runs' mean `clip_lower_frac_neg`, paired by seed);
3. a validation-accuracy deficit of `fp8_uncal` (paired difference to `bf16` below 0, interval
   excluding 0) that `fp8_cal` removes (its mean inside `bf16`'s interval); entropy surges are
   counted as well.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from nemo_fp8_rl.study.analysis import Interval, bootstrap_mean, column, paired, read_records


def targets(table: dict, roles: dict[str, str]) -> list[dict]:
    """The three targets: measured interval, threshold, and whether it is met."""
    b, u, c = roles["bf16"], roles["fp8_uncal"], roles["fp8_cal"]
    amp = bootstrap_mean(list(column(table, u, "ratio_amplification").values()))
    clip = paired(
        column(table, u, "clip_lower_frac_neg"), column(table, b, "clip_lower_frac_neg"), "ratio"
    )
    cal_clip = paired(
        column(table, c, "clip_lower_frac_neg"), column(table, b, "clip_lower_frac_neg"), "ratio"
    )
    shadow = paired(
        column(table, u, "shadow_fp8_lower_frac_neg"),
        column(table, u, "shadow_bf16_lower_frac_neg"),
        "ratio",
    )
    deficit = paired(column(table, u, "val_tail"), column(table, b, "val_tail"), "diff")
    fixed = paired(column(table, c, "val_tail"), column(table, b, "val_tail"), "diff")
    bf16_val = bootstrap_mean(list(column(table, b, "val_tail").values()))
    cal_val = bootstrap_mean(list(column(table, c, "val_tail").values()))
    unc_val = bootstrap_mean(list(column(table, u, "val_tail").values()))
    return [
        _row("ratio amplification (ratio NMAE ÷ prob NMAE), FP8 uncalibrated", amp, "≥ 1.5×",
             amp.mean >= 1.5, amp.low >= 1.5),
        _row("FP8-uncalibrated ÷ BF16 run: share of A<0 tokens clipped at the lower bound", clip,
             "≥ 2×", clip.mean >= 2.0, clip.low >= 2.0),
        _row("same tokens, FP8 ÷ BF16 shadow ratio below 1−ε (FP8-uncalibrated runs)", shadow,
             "(diagnostic)", None, None),
        _row("FP8-calibrated ÷ BF16 run: share of A<0 tokens clipped at the lower bound",
             cal_clip, "≈ 1 (diagnostic)", None, None),
        _row("validation accuracy, FP8 uncalibrated − BF16 (paired)", deficit, "< 0, interval < 0",
             deficit.mean < 0, deficit.high < 0),
        _row("validation accuracy, FP8 calibrated − BF16 (paired)", fixed, "interval ∋ 0",
             None, fixed.low <= 0 <= fixed.high if fixed.n >= 2 else None),
        _row("validation accuracy, FP8 calibrated (mean) inside the BF16 interval", cal_val,
             f"in {bf16_val.fmt()}", _inside(cal_val, bf16_val), None),
        _row("validation accuracy, FP8 uncalibrated (mean) inside the BF16 interval (control)",
             unc_val, f"in {bf16_val.fmt()}", _inside(unc_val, bf16_val), None),
    ]  # fmt: skip


def _inside(iv: Interval, ref: Interval) -> bool | None:
    """Whether `iv`'s mean lies in `ref`'s interval (None without an interval)."""
    return ref.low <= iv.mean <= ref.high if ref.n >= 2 and iv.n else None


def _row(what: str, iv: Interval, target: str, point: bool | None, strict: bool | None) -> dict:
    if iv.n == 0 or math.isnan(iv.mean):
        point = None
    if iv.n < 2:
        strict = None
    return {"what": what, "interval": iv, "target": target, "point": point, "strict": strict}


def _yes(v: bool | None) -> str:
    return "—" if v is None else ("yes" if v else "**no**")


def markdown_targets(rows: list[dict]) -> str:
    """The targets table (mean [95 % interval] over seeds)."""
    lines = [
        "| Measure (over seeds) | Mean [95 % interval] | Target | Met (mean) | Met (whole interval) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['interval'].fmt()} | {r['target']} | {_yes(r['point'])} | "
            f"{_yes(r['strict'])} |"
        )
    return "\n".join(lines)


SUMMARY_KEYS = (
    ("val_start", "val acc, step 0", "{:.3f}"),
    ("val_tail", "val acc, last 3 evals", "{:.3f}"),
    ("clip_lower_frac_neg", "clip<L share of A<0", "{:.4f}"),
    ("prob_nmae", "prob NMAE", "{:.4f}"),
    ("ratio_nmae", "ratio NMAE", "{:.4f}"),
    ("ratio_amplification", "ratio ampl.", "{:.2f}"),
    ("entropy_mean", "entropy", "{:.3f}"),
    ("entropy_surges", "surges", "{:.1f}"),
    ("calib_low_min", "lowest L", "{:.3f}"),
    ("calib_m_mean", "m per calibration", "{:.1f}"),
    ("wall_seconds", "wall s", "{:.0f}"),
    ("wall_seconds_without_warmup", "wall s w/o warm-up", "{:.0f}"),
)


def markdown_summary(table: dict, names: list[str]) -> str:
    """Per-recipe means [95 % interval] of the per-run summaries."""
    head = "| Recipe | " + " | ".join(label for _, label, _ in SUMMARY_KEYS) + " |"
    lines = [head, "|" + "---|" * (len(SUMMARY_KEYS) + 1)]
    for name in names:
        cells = []
        for key, _, spec in SUMMARY_KEYS:
            iv = bootstrap_mean(list(column(table, name, key).values()))
            cells.append("—" if iv.n == 0 or math.isnan(iv.mean) else iv.fmt(spec))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_per_seed(table: dict, names: list[str]) -> str:
    """Per-seed values (so that every interval can be checked by hand)."""
    keys = (
        "warmup_steps",
        "val_start",
        "val_tail",
        "clip_lower_frac_neg",
        "ratio_amplification",
        "entropy_surges",
        "wall_seconds",
        "warmup_seconds",
    )
    lines = ["| Recipe | seed | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for name in names:
        for seed, s in sorted(table.get(name, {}).items()):
            vals = " | ".join(
                f"{s[k]:.4g}" if s[k] is not None and math.isfinite(s[k]) else "—" for k in keys
            )
            lines.append(f"| {name} | {seed} | {vals} |")
    return "\n".join(lines)


def plots(out: Path, table: dict, names: list[str], dest: Path) -> list[Path]:
    """Per-step mean and min–max band over seeds: validation accuracy, lower clip share of
    negative-advantage tokens (smoothed over 5 steps), entropy, ratio amplification."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    series = (
        ("validation/accuracy", "validation accuracy (greedy)", 1),
        ("train/clip_lower_frac_neg", "share of A<0 tokens clipped at L (5-step mean)", 5),
        ("train/entropy", "entropy (nats/token)", 1),
        ("train/ratio_amplification", "ratio NMAE ÷ prob NMAE (shadow steps)", 1),
    )
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, label, smooth in series:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for name in names:
            runs = []
            for seed in sorted(table.get(name, {})):
                recs = [
                    r for r in read_records(out / name / f"seed-{seed}") if r.get(key) is not None
                ]
                runs.append({r["step"]: r[key] for r in recs})
            steps = sorted(set().union(*runs)) if runs else []
            if not steps:
                continue
            grid = np.array([[run.get(s, np.nan) for s in steps] for run in runs], dtype=float)
            if smooth > 1:  # trailing mean over `smooth` steps (NaN-aware, same length)
                with warnings.catch_warnings():  # all-NaN windows stay NaN, quietly
                    warnings.simplefilter("ignore", RuntimeWarning)
                    grid = np.array(
                        [
                            [np.nanmean(g[max(0, i - smooth + 1) : i + 1]) for i in range(len(g))]
                            for g in grid
                        ]
                    )
            mean = np.nanmean(grid, axis=0)
            ax.plot(steps, mean, label=f"{name} (mean of {len(runs)})")
            ax.fill_between(steps, np.nanmin(grid, axis=0), np.nanmax(grid, axis=0), alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = dest / (key.replace("/", "_") + ".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_json(path: Path, table: dict, rows: list[dict], meta: dict) -> None:
    """Machine-readable results next to the report."""
    out = {
        "meta": meta,
        "per_seed": {n: {str(s): v for s, v in d.items()} for n, d in table.items()},
        "targets": [
            {**{k: v for k, v in r.items() if k != "interval"}, "interval": vars(r["interval"])}
            for r in rows
        ],
    }
    path.write_text(json.dumps(_nulls(out), indent=1, allow_nan=False) + "\n")


def _nulls(value):
    """NaN and infinities become null (strict JSON); other values as they are."""
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


BEGIN, END = "<!-- study-table:begin -->", "<!-- study-table:end -->"


def splice(path: Path, block: str) -> bool:
    """Replace the text between the study-table markers in `path`; False when it has none."""
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        return False
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{block.strip()}\n{END}{tail}", encoding="utf-8")
    return True
