"""Compare BF16 and FP8 runs: how their runs differ, and what differs between their recipes.

`compare_runs` reads metrics (see `nemo_fp8_rl.analysis.rundata`), aligns them by step, reduces
each to the summary columns in `COLUMNS`, finds entropy surges, and writes one verdict per FP8
run against the reference (the first BF16 run, else the first run). When every run saved its
recipe, the recipes are diffed by `nemo_fp8_rl.analysis.recipe_diff.diff_configs`.

Everything here is plain data and numpy: rendering lives in `nemo_fp8_rl.analysis.report`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nemo_fp8_rl.analysis.accuracy_check import nonfinite_reason, not_comparable
from nemo_fp8_rl.analysis.health import health_notes
from nemo_fp8_rl.analysis.recipe_diff import RecipeDiff, diff_configs, precision_of
from nemo_fp8_rl.analysis.rundata import RunData, Series
from nemo_fp8_rl.analysis.surge import detect_entropy_surges
from nemo_fp8_rl.config import placement
from nemo_fp8_rl.runs import scores

TAIL_STEPS = 10  # "final" reward and entropy: mean of the last 10 logged points (one is noise)
DEFAULT_TOLERANCE_POINTS = 2.0
STEP_TIME = "timing/train/total_step_time"


def _last(s: Series) -> float:
    return float(s.values[-1])


def _best(s: Series) -> float:
    return float(np.max(s.values))


def _tail(s: Series) -> float:
    return float(np.mean(s.values[-TAIL_STEPS:]))


def _mean(s: Series) -> float:
    return float(np.mean(s.values))


def _after_start(s: Series) -> float:
    """Mean over the points after step 0 (the verdict's accuracy endpoint, `accuracy_gap`)."""
    values = s.values[s.steps > 0]
    return float(np.mean(values)) if values.size else float("nan")


def _steady(s: Series) -> float:
    """Mean without the first logged step (warm-up, compilation, first allocation)."""
    return float(np.mean(s.values[1:] if len(s) > 1 else s.values))


@dataclass(frozen=True)
class Column:
    """One summary column: a metric reduced over the run's finite points."""

    key: str
    header: str
    metric: str
    reduce: Callable[[Series], float]
    fmt: str = "{:.3f}"


COLUMNS: tuple[Column, ...] = (
    Column("val_acc_mean", "val acc mean after step 0", scores.BF16_ACCURACY, _after_start),
    Column("val_acc_final", "val acc final", scores.BF16_ACCURACY, _last),
    Column("val_acc_best", "val acc best", scores.BF16_ACCURACY, _best),
    Column("reward", "reward (last 10)", "train/reward", _tail),
    Column("entropy", "entropy (last 10)", "train/entropy", _tail),
    Column("clip_low_neg", "clip<L, A<0", "train/clip_lower_frac_neg", _mean, "{:.4f}"),
    Column("clip_high_pos", "clip>H, A>0", "train/clip_upper_frac_pos", _mean, "{:.4f}"),
    Column("clip_dual_neg", "dual clip, A<0", "train/clip_dual_frac_neg", _mean, "{:.4f}"),
    Column("calib_low", "L final", "train/calib_low", _last),
    Column("calib_high", "H final", "train/calib_high", _last),
    Column(
        "token_mult_prob_error",
        "token_mult_prob_error",
        "train/token_mult_prob_error",
        _mean,
        "{:.4f}",
    ),
    Column("gen_kl_error", "gen_kl_error", "train/gen_kl_error", _mean, "{:.2e}"),
    Column("step_time", "step s", "timing/train/total_step_time", _steady, "{:.2f}"),
    Column("t_generate", "generate s", "timing/train/generate", _steady, "{:.2f}"),
    Column("t_logprobs", "logprobs s", "timing/train/logprobs", _steady, "{:.2f}"),
    Column("t_train", "train s", "timing/train/policy_training", _steady, "{:.2f}"),
    Column("t_refit", "refit s", "timing/train/refit", _steady, "{:.2f}"),
    Column("t_shadow", "shadow s", "timing/train/shadow", _steady, "{:.2f}"),
    Column("tokens_per_sec", "tokens/s", "throughput/tokens_per_sec", _steady, "{:.0f}"),
)
SPEEDUP_HEADER = "speedup"


@dataclass
class RunSummary:
    """One run reduced to the summary columns (NaN where a metric is missing)."""

    name: str
    precision: str
    last_step: int
    values: dict[str, float]
    best_val_step: int | None
    surge_step: int | None
    missing: list[str]
    notes: list[str]
    surge_steps: list[int] = field(default_factory=list)  # every onset (z-score detector)


@dataclass
class Comparison:
    """Runs, their summaries, the diff of their recipes, and one verdict per FP8 run."""

    runs: list[RunData]
    summaries: list[RunSummary]
    recipe_diff: RecipeDiff | None
    verdicts: list[str]
    reference: int


def entropy_surges(entropy: Series) -> list[int]:
    """Steps where an entropy surge began (`nemo_fp8_rl.analysis.surge.EntropySurgeDetector`, default rule)."""
    return detect_entropy_surges(entropy.steps.tolist(), entropy.values.tolist())


def summarize_run(run: RunData) -> RunSummary:
    """Reduce one run to `COLUMNS`, record which metrics it lacks, and find an entropy surge."""
    values: dict[str, float] = {}
    missing: list[str] = []
    notes = list(run.notes)
    reason = nonfinite_reason(run, accuracy_metrics([run])[0][0])
    if reason is not None:
        notes.append(reason)
    for column in COLUMNS:
        series, found = run.find(column.metric)
        series = series.finite() if series is not None else None
        if series is None or not len(series):
            values[column.key] = float("nan")
            if column.metric not in missing:
                missing.append(column.metric)
            continue
        values[column.key] = column.reduce(series)
        alias_note = f"{column.metric} read from {found}"
        if found != column.metric and alias_note not in notes:
            notes.append(alias_note)
    accuracy, _ = run.find(scores.BF16_ACCURACY)
    best_step = None
    if accuracy is not None and len(accuracy.finite()):
        finite = accuracy.finite()
        best_step = int(finite.steps[int(np.argmax(finite.values))])
    entropy, _ = run.find("train/entropy")
    onsets = entropy_surges(entropy) if entropy is not None else []
    if len(onsets) > 1:
        notes.append(f"entropy surges began at steps {', '.join(map(str, onsets))}")
    surge = onsets[0] if onsets else None
    return RunSummary(
        run.name,
        precision_of(run.config),
        run.last_step,
        values,
        best_step,
        surge,
        missing,
        notes,
        onsets,
    )


def align(runs: Sequence[RunData], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """All runs' values of `metric` on the union of their steps: (steps, values[run, step]), NaN where absent."""
    found = [r.find(metric)[0] for r in runs]
    steps = np.unique(
        np.concatenate([s.steps for s in found if s is not None] or [np.zeros(0, np.int64)])
    )
    table = np.full((len(runs), steps.size), np.nan)
    for i, series in enumerate(found):
        if series is not None:
            table[i, np.searchsorted(steps, series.steps)] = series.values
    return steps, table


def speed_unknown_reason(reference: RunData, run: RunData) -> str:
    """Why `speedup(reference, run)` is NaN: which run lacks timing, or how many of its step
    times are not finite (the speedup needs two finite ones, the first being warm-up)."""
    for r in (run, reference):
        series, _ = r.find(STEP_TIME)
        if series is None:
            return f"{r.name} logged no {STEP_TIME}"
        n = len(series)
        finite = int(np.count_nonzero(np.isfinite(series.values)))
        if finite < 2:
            return (
                f"{r.name}: {STEP_TIME} has {finite} finite of {n} points, {n - finite} NaN or "
                "infinite (the speedup needs 2, the first being warm-up)"
            )
    return f"{STEP_TIME} is not positive"


def speedup(reference: RunData, run: RunData) -> float:
    """Mean step time of `reference` over that of `run`, on the steps both logged (first one dropped).

    speedup = mean_{k in K} t_ref(k) / mean_{k in K} t_run(k), K = common steps after the first;
    each run's own steady mean when the two share no step. NaN when either lacks timing.
    """
    steps, table = align([reference, run], "timing/train/total_step_time")
    both = np.isfinite(table).all(axis=0)
    if both.sum() > 1:
        ref, cur = table[0, both][1:], table[1, both][1:]
    else:
        ref, cur = (table[i][np.isfinite(table[i])][1:] for i in (0, 1))
    if not ref.size or not cur.size or np.mean(cur) <= 0:
        return float("nan")
    return float(np.mean(ref) / np.mean(cur))


LOAD = "system/load_average_1min"
# Two runs' mean loads are comparable when they differ by at most this share of the larger one
# (or by at most LOAD_SLACK: on an idle machine 0.2 against 0.5 is no difference).
LOAD_TOLERANCE = 0.25
LOAD_SLACK = 0.5


def on_cpu(run: RunData) -> bool:
    """Whether `run` ran on the embedded CPU engine (its recipe has no GPUs)."""
    return bool(run.config) and placement.on_cpu(run.config)


def mean_load(run: RunData) -> float | None:
    """The mean 1-minute load average `run` recorded over its steps, or None."""
    series, _ = run.find(LOAD)
    if series is None:
        return None
    values = series.values[np.isfinite(series.values)]
    return float(np.mean(values)) if values.size else None


def speed_refusal(reference: RunData, run: RunData) -> str | None:
    """Why the speed of two CPU runs is not compared (their step times measure the machine's
    load unless both recorded a comparable one), or None when it may be. GPU runs: None."""
    if not (on_cpu(reference) or on_cpu(run)):
        return None
    loads = [mean_load(reference), mean_load(run)]
    if None in loads:
        missing = [r.name for r, x in zip((reference, run), loads, strict=True) if x is None]
        return f"speed not compared: {', '.join(missing)} recorded no {LOAD}"
    low, high = sorted(loads)
    if high - low > max(LOAD_SLACK, LOAD_TOLERANCE * high):
        return (
            f"speed not compared: the machine's load differed ({loads[0]:.1f} vs {loads[1]:.1f}, "
            "mean 1-minute load average over the steps), so the step times measure the load"
        )
    return None


def pace(reference: RunData, run: RunData, speed: float, no_speed: str) -> str:
    """The speed part of a verdict: the speedup, why it is not given, and, for an FP8 run on
    the CPU, that its FP8 is emulated (quantize-dequantize: slower by design)."""
    refusal = speed_refusal(reference, run)
    if refusal is not None:
        text = refusal
    elif not np.isfinite(speed):
        text = f"speed unknown ({no_speed})"
    else:
        text = f"{speed:.2f}x faster" if speed >= 1.0 else f"{1.0 / speed:.2f}x slower"
    if on_cpu(run) and precision_of(run.config).startswith("fp8"):
        text += " (FP8 emulated on the CPU: a measure of the emulation, not of FP8 speed)"
    return text


def accuracy_metrics(runs: Sequence[RunData]) -> tuple[tuple[str, str], ...]:
    """The accuracy metrics a verdict may read, best first, with their labels: the BF16-generation
    score when every run logged it, else the rollout engine's (never one of each)."""
    if all(r.get(scores.BF16_ACCURACY) is not None for r in runs):
        key = scores.BF16_ACCURACY
    else:
        key = scores.ROLLOUT_ACCURACY
    return ((key, f"mean validation accuracy after step 0, {scores.accuracy_label(key)}"),)


def accuracy_gap(reference: RunData, run: RunData) -> tuple[float, str, int] | None:
    """Points (x100) by which `run` is above `reference`, on the last step both logged.

    The study's primary endpoint: validation accuracy (`accuracy_metrics`: BF16 generation when
    both runs logged it) averaged over every common validation step after step 0 (step 0 is the
    policy before any GRPO step, the same in a fair pair); without one, the mean reward of the last `TAIL_STEPS` common steps.
    Returns (points, what was compared, step), or None (also when either run's accuracy holds
    a NaN or an infinity: `accuracy_check`; the verdict never falls back to reward for it).
    """
    if not_comparable([reference, run], accuracy_metrics([reference, run])[0][0]):
        return None
    for metric, label in (*accuracy_metrics([reference, run]), ("train/reward", "reward")):
        steps, table = align([reference, run], metric)
        both = np.flatnonzero(np.isfinite(table).all(axis=0) & (steps > 0))
        if both.size:
            validation = metric.startswith("validation/")
            picked = both if validation else both[-TAIL_STEPS:]
            gap = np.mean(table[1, picked]) - np.mean(table[0, picked])
            return float(100.0 * gap), label, int(steps[both[-1]])
    return None


def verdict(
    reference: RunSummary,
    summary: RunSummary,
    gap: tuple[float, str, int] | None,
    speed: float,
    tolerance_points: float,
    no_speed: str = f"no {STEP_TIME}",
    speed_text: str | None = None,
    why_not: str | None = None,
) -> str:
    """One line: accuracy against the reference, speed (or why it is unknown: `no_speed`), and
    entropy health of one run."""
    ref = "BF16" if reference.precision == "bf16" else reference.name
    if gap is None:
        accuracy = why_not or (
            "accuracy not comparable (neither validation accuracy nor train/reward in both runs)"
        )
    else:
        points, label, step = gap
        within = abs(points) <= tolerance_points
        rule = f"{'within' if within else 'beyond'} the ±{tolerance_points:g}-point tolerance"
        side = "matches" if within else ("above" if points > 0 else "below")
        accuracy = f"{side} {ref}: {points:+.1f} points on {label} to step {step}, {rule}"
    if speed_text is not None:
        pace_text = speed_text
    elif not np.isfinite(speed):
        pace_text = f"speed unknown ({no_speed})"
    else:
        pace_text = f"{speed:.2f}x faster" if speed >= 1.0 else f"{1.0 / speed:.2f}x slower"
    return f"{summary.name} ({summary.precision.upper()}): {accuracy}, {pace_text}, {surge_text(reference, summary)}"


SAME_ONSET_STEPS = 2  # a reference onset this close to the run's is the same event


def surge_text(reference: RunSummary, summary: RunSummary) -> str:
    """The run's first entropy surge onset (z-score detector), and whether the reference run
    has one within `SAME_ONSET_STEPS` steps of it (then it is not the run's precision's doing)."""
    if "train/entropy" in summary.missing:
        return "entropy not logged"
    if summary.surge_step is None:
        return "no entropy surge (z-score detector)"
    text = f"entropy surge at step {summary.surge_step} (z-score detector)"
    near = [s for s in reference.surge_steps if abs(s - summary.surge_step) <= SAME_ONSET_STEPS]
    if near:
        text += f", as in {reference.name} (step {near[0]}): not this precision's"
    return text


def _reference_index(summaries: Sequence[RunSummary]) -> int:
    """The first BF16 run, else the first run."""
    return next((i for i, s in enumerate(summaries) if s.precision == "bf16"), 0)


def compare_runs(
    runs: Sequence[RunData], tolerance_points: float = DEFAULT_TOLERANCE_POINTS
) -> Comparison:
    """Summaries, recipe diff (when every run saved its recipe) and verdicts for two or more runs.

    Every run that is not BF16 (FP8, or of unknown precision) other than the reference gets a
    verdict; the speedup column is each run's speed over the first run.

    Raises:
        ValueError: fewer than two runs.
    """
    if len(runs) < 2:
        raise ValueError(f"compare needs two or more runs, got {len(runs)}")
    summaries = [summarize_run(r) for r in runs]
    for run, summary in zip(runs, summaries, strict=True):  # no number where speed is refused
        refused = speed_refusal(runs[0], run) is not None
        summary.values["speedup"] = float("nan") if refused else speedup(runs[0], run)
    ref = _reference_index(summaries)
    verdicts = [
        verdict(
            summaries[ref],
            s,
            accuracy_gap(runs[ref], r),
            speedup(runs[ref], r),
            tolerance_points,
            speed_unknown_reason(runs[ref], r),
            pace(runs[ref], r, speedup(runs[ref], r), speed_unknown_reason(runs[ref], r)),
            not_comparable([runs[ref], r], accuracy_metrics([runs[ref], r])[0][0]),
        )
        for i, (r, s) in enumerate(zip(runs, summaries, strict=True))
        if i != ref and s.precision != "bf16"
    ]
    notes = health_notes(runs, [s.precision for s in summaries], ref)
    for summary, extra in zip(summaries, notes, strict=True):
        summary.notes += extra
    configs = [r.config for r in runs]
    diff = diff_configs([r.name for r in runs], configs) if all(configs) else None
    return Comparison(list(runs), summaries, diff, verdicts, ref)
