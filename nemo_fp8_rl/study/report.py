"""The study's report: the targets table with 95 % intervals over seeds, and PNG plots.

Three recipes play fixed roles: `bf16` (reference), `fp8_uncal` (FP8 with the nominal bounds)
and `fp8_cal` (FP8 with Calibrated Clipping). The method's claims, as targets over seeds:
1. the FP8 errors of the two passes that form the ratio compound: `ratio_compounding`
   (ratio error ÷ single-pass error) of `fp8_uncal` > 1, and ≥ √2 = 1.41 if independent; the
   paper-style quotient (ratio NMAE ÷ prob NMAE, reported as 1.7–2.9×) is shown beside it,
   named as what it is (≈ 2 for one FP8 pass, so it does not measure compounding);
2. `fp8_uncal` clips ≥ 2× `bf16`'s share of negative-advantage tokens at the lower bound
   (geometric mean of the per-seed quotients);
3. FP8 loses validation accuracy against BF16 (`fp8_uncal` − `bf16` < 0, paired by seed) and
   calibration recovers it (`fp8_cal` − `fp8_uncal` > 0); `fp8_cal` − `bf16` is shown too.
   Accuracy is the primary endpoint (`endpoints.yaml`, fixed after the committed runs: mean over every
   evaluation after step 0), gain from step 0 the secondary; the rows name the score they read
   (BF16 generation, or each run's rollout precision for runs without the BF16 score), and a
   row measures the scoring confound at step 0, where every recipe has the same weights;
4. entropy: FP8's surge statistic (largest entropy rise above the trailing-window minimum,
   `endpoints.yaml`) exceeds BF16's and calibration lowers it; per run, a surge is a rise at or
   above the threshold (per-seed table).
"Met (whole interval)" needs the 95 % interval (Student-t, n seeds) on the target's side.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.study.analysis import (
    Interval,
    column,
    mean_interval,
    paired,
    read_records,
    report_scoring,
)

SQRT2 = math.sqrt(2.0)


def targets(table: dict, roles: dict[str, str]) -> list[dict]:
    """The targets: measured interval, threshold, and whether it is met."""
    b, u, c = roles["bf16"], roles["fp8_uncal"], roles["fp8_cal"]

    def mean(name: str, key: str) -> Interval:
        return mean_interval(list(column(table, name, key).values()))

    def pair(x: str, y: str, key: str, op: str) -> Interval:
        return paired(column(table, x, key), column(table, y, key), op)

    comp, amp = mean(u, "ratio_compounding"), mean(u, "ratio_amplification")
    clip = pair(u, b, "clip_lower_frac_neg", "ratio")
    cal_clip = pair(c, b, "clip_lower_frac_neg", "ratio")
    shadow = paired(
        column(table, u, "shadow_fp8_lower_frac_neg"),
        column(table, u, "shadow_bf16_lower_frac_neg"),
        "ratio",
    )
    deficit = pair(u, b, "val_mean", "diff")
    recovered = pair(c, u, "val_mean", "diff")
    cal_gap = pair(c, b, "val_mean", "diff")
    gain_deficit = pair(u, b, "val_gain", "diff")
    gain_recovered = pair(c, u, "val_gain", "diff")
    confound = pair(u, b, "val_start", "diff")
    how = scored_with(table)
    # FP8 runs scored by FP8 generation against BF16 runs scored in BF16: what the difference
    # measures mixes training with scoring, so no target can be met or missed by it
    mixed = how != "BF16-scored"
    rise_u, rise_c = pair(u, b, "entropy_rise", "diff"), pair(c, u, "entropy_rise", "diff")
    return [
        _row("compounding: ratio error ÷ single-pass error, FP8 uncalibrated", comp,
             "> 1 (noisier than one pass); 0 = cancel, √2 = 1.41 independent", comp.mean > 1.0,
             comp.low > 1.0),
        _row("same, FP8 uncalibrated, at least independent errors", comp, "≥ 1.41",
             comp.mean >= SQRT2, comp.low >= SQRT2),
        _row("paper-style quotient: ratio NMAE ÷ prob NMAE, FP8 uncalibrated (≈ 2 for one pass)",
             amp, "paper: 1.7–2.9 (not a compounding measure)", None, None),
        _row("FP8-uncalibrated ÷ BF16 run: share of A<0 tokens clipped at the lower bound "
             "(geometric mean of per-seed quotients)", clip, "≥ 2×", clip.mean >= 2.0,
             clip.low >= 2.0),
        _row("same tokens, FP8 ÷ BF16 shadow ratio below 1−ε (FP8-uncalibrated runs)", shadow,
             "(diagnostic)", None, None),
        _row("FP8-calibrated ÷ BF16 run: share of A<0 tokens clipped at the lower bound",
             cal_clip, "(diagnostic; 1 = BF16's clipping)", None, None),
        _row(f"accuracy (primary: mean after step 0, {how}), FP8 uncalibrated − BF16 (paired)",
             deficit, "< 0", deficit.mean < 0, deficit.high < 0, mixed),
        _row(f"accuracy (primary, {how}), FP8 calibrated − FP8 uncalibrated (paired)", recovered,
             "> 0", recovered.mean > 0, recovered.low > 0),
        _row(f"accuracy (primary, {how}), FP8 calibrated − BF16 (paired)", cal_gap,
             "(diagnostic; ≈ 0 if calibration recovers all)", None, None),
        _row(f"accuracy gain from step 0 (secondary, {how}), FP8 uncalibrated − BF16 (paired)",
             gain_deficit, "< 0", gain_deficit.mean < 0, gain_deficit.high < 0, mixed),
        _row(f"accuracy gain from step 0 (secondary, {how}), FP8 calibrated − FP8 uncalibrated "
             "(paired)", gain_recovered, "> 0", gain_recovered.mean > 0, gain_recovered.low > 0),
        _row(f"step-0 accuracy, FP8 uncalibrated − BF16 (paired; same weights, so only the "
             f"scoring differs; {how})", confound, "(diagnostic; 0 when both are BF16-scored)",
             None, None),
        _row("largest entropy rise above the trailing-window minimum (surge statistic), FP8 "
             "uncalibrated − BF16 (paired)", rise_u, "> 0 (a run surges at ≥ the threshold)",
             rise_u.mean > 0, rise_u.low > 0),
        _row("same, FP8 calibrated − FP8 uncalibrated (paired)", rise_c, "< 0",
             rise_c.mean < 0, rise_c.high < 0),
    ]  # fmt: skip


def scored_with(table: dict) -> str:
    """How the runs' accuracies were scored (`analysis.report_scoring`)."""
    return report_scoring(table)


CONFOUNDED = "confounded"  # a Met cell of a difference that mixes training with scoring


def _row(
    what: str,
    iv: Interval,
    target: str,
    point: bool | None,
    strict: bool | None,
    confounded: bool = False,
) -> dict:
    if iv.n == 0 or math.isnan(iv.mean):
        point = None
    if iv.n < 2 or math.isnan(iv.low):
        strict = None
    if confounded:
        point = strict = CONFOUNDED
    return {"what": what, "interval": iv, "target": target, "point": point, "strict": strict}


def _yes(v: bool | str | None) -> str:
    if v == CONFOUNDED:
        return "n/a: FP8- vs BF16-scored"
    return "—" if v is None else ("yes" if v else "**no**")


def markdown_targets(rows: list[dict]) -> str:
    """The targets table (mean [95 % interval] (n seeds))."""
    lines = [
        "| Measure (over seeds) | Mean [95 % interval] (n) | Target | Met (mean) | Met (whole interval) |",
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
    ("val_mean", "val acc, mean after step 0 (primary)", "{:.3f}"),
    ("val_gain", "gain from step 0 (secondary)", "{:.3f}"),
    ("val_tail", "val acc, last 3 evals", "{:.3f}"),
    ("clip_lower_frac_neg", "clip<L share of A<0", "{:.4f}"),
    ("prob_nmae", "prob NMAE", "{:.4f}"),
    ("ratio_nmae", "ratio NMAE", "{:.4f}"),
    ("single_pass_nmae", "single-pass error", "{:.4f}"),
    ("ratio_compounding", "compounding", "{:.2f}"),
    ("ratio_amplification", "paper-style quotient", "{:.2f}"),
    ("entropy_mean", "entropy", "{:.3f}"),
    ("entropy_rise", "largest entropy rise", "{:.3f}"),
    ("entropy_surges", "surges (z-score detector)", "{:.1f}"),
    ("calib_low_min", "lowest L", "{:.3f}"),
    ("calib_m_mean", "m per calibration", "{:.1f}"),
    ("calib_pool_mean", "M (pooled)", "{:.1f}"),
    ("wall_seconds", "wall s", "{:.0f}"),
)


def markdown_summary(table: dict, names: list[str]) -> str:
    """Per-recipe means [95 % t-interval] (n) of the per-run summaries."""
    head = "| Recipe | " + " | ".join(label for _, label, _ in SUMMARY_KEYS) + " |"
    lines = [head, "|" + "---|" * (len(SUMMARY_KEYS) + 1)]
    for name in names:
        cells = []
        for key, _, spec in SUMMARY_KEYS:
            iv = mean_interval(list(column(table, name, key).values()))
            cells.append("—" if iv.n == 0 or math.isnan(iv.mean) else iv.fmt(spec))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_per_seed(table: dict, names: list[str]) -> str:
    """Per-seed values (so that every interval can be checked by hand)."""
    keys = (
        "warmup_steps",
        "warmup_accuracy",
        "val_start",
        "val_mean",
        "val_gain",
        "val_tail",
        "val_scored_bf16",
        "entropy_rise",
        "clip_lower_frac_neg",
        "ratio_compounding",
        "ratio_amplification",
        "entropy_surges",
        "wall_seconds",
    )
    lines = ["| Recipe | seed | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for name in names:
        for seed, s in sorted(table.get(name, {}).items()):
            vals = " | ".join(
                f"{s[k]:.4g}" if s[k] is not None and math.isfinite(s[k]) else "—" for k in keys
            )
            lines.append(f"| {name} | {seed} | {vals} |")
    return "\n".join(lines)


def draw_recipe(ax, steps: list[int], grid, name: str, names: list[str]) -> None:
    """One recipe on a study plot: the mean over seeds (rows of `grid`) and its 95 % Student-t
    interval per step (the intervals the tables quote), in the recipe's own color (its place in
    `names`, the same in every figure)."""
    from nemo_fp8_rl.analysis.stats import band

    mean, low, high = band(grid)
    color = f"C{names.index(name)}"
    runs = len(grid)
    seeds = f"{runs} seed{'s' if runs != 1 else ''}"
    what = "mean, band: 95 % Student-t interval" if runs > 1 else "one run"
    ax.plot(steps, mean, color=color, label=f"{name} ({seeds}, {what})")
    if runs > 1:
        ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)


# (metric, y label, trailing-mean steps, title) of the study's plots
SERIES = (
    ("validation/accuracy", "validation accuracy (greedy,\nrollout precision)", 1,
     "Validation accuracy, scored in each run's rollout precision"),
    ("train/clip_lower_frac_neg", "share of A<0 tokens\nclipped at L (5-step mean)", 5,
     "Negative-advantage tokens clipped at the lower bound"),
    ("train/entropy", "entropy (nats/token)", 1, "Policy entropy"),
    ("train/ratio_compounding", "ratio error ÷ single-pass\nerror (shadow steps)", 1,
     "Compounding of the two passes' FP8 errors in the ratio"),
)  # fmt: skip
# Reference levels of the compounding: one pass's error, and two independent passes' errors
COMPOUNDING_LINES = ((1.0, "1: as noisy as one pass"), (2**0.5, "√2 ≈ 1.41: independent errors"))


def series_grid(out: Path, table: dict, name: str, key: str, smooth: int):
    """(steps, values[seed, step]) of `key` over one recipe's seeds, a trailing mean over
    `smooth` steps applied (NaN-aware); None when no seed logged it."""
    import numpy as np

    runs = []
    for seed in sorted(table.get(name, {})):
        recs = [r for r in read_records(out / name / f"seed-{seed}") if r.get(key) is not None]
        runs.append({r["step"]: r[key] for r in recs})
    steps = sorted(set().union(*runs)) if runs else []
    if not steps:
        return None
    grid = np.array([[run.get(s, np.nan) for s in steps] for run in runs], dtype=float)
    if smooth > 1:
        with warnings.catch_warnings():  # all-NaN windows stay NaN, quietly
            warnings.simplefilter("ignore", RuntimeWarning)
            grid = np.array(
                [[np.nanmean(g[max(0, i - smooth + 1) : i + 1]) for i in range(len(g))]
                 for g in grid]
            )  # fmt: skip
    return steps, grid


def study_figure(key: str, label: str, title: str, recipes: dict, names: list[str]):
    """One titled figure: each recipe's mean over seeds and its band (`recipes`: name ->
    (steps, grid)); accuracy on the whole [0, 1], the compounding with its 1 and √2 lines."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    ax.set_title(title, fontsize=10)
    for name, (steps, grid) in recipes.items():
        draw_recipe(ax, steps, grid, name, names)
    if key == "train/ratio_compounding":
        for level, what in COMPOUNDING_LINES:
            ax.axhline(level, color="gray", ls="--", lw=0.8)
            ax.annotate(what, (0.01, level), xycoords=("axes fraction", "data"), fontsize=7,
                        color="gray", va="bottom")  # fmt: skip
    if key == "validation/accuracy":
        ax.set_ylim(0.0, 1.0)  # the whole range: a cut axis magnifies seed noise
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(label)
    if ax.lines:  # a metric no run logged leaves an empty panel, without a legend
        # below the axes, where it covers no data
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.tight_layout()
    return fig


def plots(out: Path, table: dict, names: list[str], dest: Path) -> list[Path]:
    """Per-step mean over seeds and its 95 % Student-t interval (the intervals the tables quote),
    one color per recipe: validation accuracy, lower clip share of negative-advantage tokens
    (smoothed over 5 steps), entropy, ratio compounding (`SERIES`)."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, label, smooth, title in SERIES:
        recipes = {}
        for name in names:
            found = series_grid(out, table, name, key, smooth)
            if found is not None:
                recipes[name] = found
        fig = study_figure(key, label, title, recipes, names)
        path = dest / (key.replace("/", "_") + ".png")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")  # safe-write: buffer
        write_atomic(path, buffer.getvalue())
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
    write_atomic(path, json.dumps(_nulls(out), indent=1, allow_nan=False) + "\n")


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
    write_atomic(path, f"{head}{BEGIN}\n{block.strip()}\n{END}{tail}")
    return True
