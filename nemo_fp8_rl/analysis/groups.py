"""Compare recipes over seeds: runs grouped by recipe, mean and 95 % interval per metric,
differences paired by seed, and verdicts that say whether a gap is more than seed noise.

A group is every run of one recipe: the recipe name saved in its `recipe.yaml`
(`logger.wandb.name`), else the parent folder of a `seed-<k>` run directory, else the run's own
name. A run's seed is `grpo.seed` from its `recipe.yaml`, else the `<k>` of `seed-<k>`.

Each run is reduced exactly as in a single-run comparison (`nemo_fp8_rl.analysis.compare.summarize_run`,
plus the shadow-pass metrics in `EXTRA_COLUMNS`); the statistics are over seeds
(`nemo_fp8_rl.analysis.stats`). Verdict for a group against the reference group (the first BF16 group,
else the first): accuracy difference in points with its interval, "within noise" when the
interval contains 0; with one run on either side it says the verdict rests on one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.accuracy_check import excluded_runs
from nemo_fp8_rl.analysis.compare import (
    COLUMNS,
    DEFAULT_TOLERANCE_POINTS,
    TAIL_STEPS,
    Column,
    accuracy_metrics,
    align,
    summarize_run,
)
from nemo_fp8_rl.analysis.recipe_diff import RecipeDiff, diff_configs
from nemo_fp8_rl.analysis.rundata import RunData
from nemo_fp8_rl.runs import scores
from nemo_fp8_rl.runs.seeds import seed_of_dir


def _mean(s) -> float:
    return float(np.mean(s.values))


def _sum(s) -> float:
    return float(np.sum(s.values))


EXTRA_COLUMNS: tuple[Column, ...] = (
    Column("prob_nmae", "prob NMAE", "train/prob_nmae", _mean, "{:.4f}"),
    Column("ratio_nmae", "ratio NMAE", "train/ratio_nmae", _mean, "{:.4f}"),
    Column("ratio_amplification", "ratio amplification", "train/ratio_amplification", _mean),
    Column(
        "overclip_tokens",
        "over-clipped A<0 tokens (sum)",
        "train/overclip_neg_tokens",
        _sum,
        "{:.0f}",
    ),
    *(
        Column(
            f"overclip_q{q}",
            f"over-clip share, entropy Q{q}",
            f"train/overclip_share_entropy_q{q}",
            _mean,
        )
        for q in range(1, 5)
    ),
    Column(
        "clip_lower_tokens",
        "lower-clipped A<0 tokens (sum)",
        "train/clip_lower_neg_tokens",
        _sum,
        "{:.0f}",
    ),
    *(
        Column(
            f"clip_lower_q{q}",
            f"lower-clip share, entropy Q{q}",
            f"train/clip_lower_share_entropy_q{q}",
            _mean,
        )
        for q in range(1, 5)
    ),
)
GROUP_COLUMNS: tuple[Column, ...] = (*COLUMNS, *EXTRA_COLUMNS)
# entropy-quartile shares are pooled over steps, weighted by that step's token count
SHARE_COUNTS = {
    "train/overclip_share_entropy_q": "train/overclip_neg_tokens",
    "train/clip_lower_share_entropy_q": "train/clip_lower_neg_tokens",
}
RATIO_KEYS = ("clip_low_neg",)  # also reported as a ratio to the reference (e.g. 2.1x BF16's)
FEW_SEEDS = "over 2 seeds the t factor is 12.7, so the interval says little: run 3 or more"
ONE_RUN = (
    "rests on one run per recipe, so seed-to-seed noise is unknown (more seeds: the commands below)"
)


@dataclass
class RunGroup:
    """The runs of one recipe and their seeds (None where a run's seed is unknown)."""

    name: str
    runs: list[RunData]
    seeds: list[int | None]
    notes: list[str] = field(default_factory=list)

    def keyed(self, values: Sequence[float]) -> dict[int, float]:
        """Values by seed; a run without a seed gets a negative key that never pairs."""
        return {
            (-1 - i if s is None else s): v
            for i, (s, v) in enumerate(zip(self.seeds, values, strict=True))
        }


@dataclass
class GroupSummary:
    """One group reduced: per metric the value of each seed and the mean with its interval."""

    name: str
    precision: str
    seeds: list[int | None]
    per_seed: dict[str, dict[int, float]]
    stats: dict[str, stats.Interval]
    surges: int
    last_steps: list[int]


@dataclass
class Gap:
    """Accuracy of a group against the reference: difference in points (and how it was taken)."""

    interval: stats.Interval
    paired: bool
    label: str
    step: int | None
    excluded: list[str] = field(default_factory=list)  # runs left out, with why


@dataclass
class GroupComparison:
    """Groups, their summaries, differences to the reference group, verdicts."""

    groups: list[RunGroup]
    summaries: list[GroupSummary]
    reference: int
    differences: dict[str, dict[str, tuple[stats.Interval, bool]]]
    ratios: dict[str, dict[str, stats.Interval]]
    gaps: dict[str, Gap | None]
    verdicts: list[str]
    recipe_diff: RecipeDiff | None = None  # between the groups' recipes, the seed left out

    @property
    def single_runs(self) -> bool:
        """True when every group holds one run (no interval anywhere)."""
        return all(len(g.runs) == 1 for g in self.groups)


def run_seed(run: RunData) -> int | None:
    """`grpo.seed` from the run's recipe, else the `<k>` of a `seed-<k>` folder."""
    seed = ((run.config or {}).get("grpo") or {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    return seed_of_dir(run.path)


def recipe_name(run: RunData) -> str:
    """The recipe a run belongs to (see the module docstring)."""
    name = (((run.config or {}).get("logger") or {}).get("wandb") or {}).get("name")
    if isinstance(name, str) and name:
        return name
    return run.path.parent.name if seed_of_dir(run.path) is not None else run.name


def group_runs(runs: Sequence[RunData]) -> list[RunGroup]:
    """Runs grouped by recipe, in order of first appearance; notes on odd groups."""
    groups: dict[str, RunGroup] = {}
    for run in runs:
        group = groups.setdefault(recipe_name(run), RunGroup(recipe_name(run), [], []))
        group.runs.append(run)
        group.seeds.append(run_seed(run))
    for group in groups.values():
        known = [s for s in group.seeds if s is not None]
        if len(set(known)) < len(known):
            group.notes.append(f"{group.name}: the same seed appears twice ({group.seeds})")
        configs = [r.config for r in group.runs]
        if len(configs) > 1 and all(configs):
            diff = diff_configs([r.name for r in group.runs], configs)
            other = [e.key for e in diff.entries if e.group != "derived" and "seed" not in e.key]
            if other:
                group.notes.append(
                    f"{group.name}: runs differ in more than the seed: {', '.join(other[:6])}"
                )
    return list(groups.values())


def summarize_group(group: RunGroup) -> GroupSummary:
    """Every `GROUP_COLUMNS` metric per seed, and its mean with a Student-t interval."""
    run_summaries = [summarize_run(r) for r in group.runs]
    per_seed: dict[str, dict[int, float]] = {}
    intervals: dict[str, stats.Interval] = {}
    for column in GROUP_COLUMNS:
        values = [run_value(run, column) for run in group.runs]
        per_seed[column.key] = group.keyed(values)
        intervals[column.key] = stats.mean_interval(values)
    precisions = {s.precision for s in run_summaries}
    return GroupSummary(
        group.name,
        precisions.pop() if len(precisions) == 1 else "mixed",
        list(group.seeds),
        per_seed,
        intervals,
        sum(s.surge_step is not None for s in run_summaries),
        [r.last_step for r in group.runs],
    )


def run_value(run: RunData, column: Column) -> float:
    """One run's value of a summary column (NaN when not logged); the entropy-quartile shares
    pooled over steps: `Σ_t share_t n_t / Σ_t n_t`, n_t the step's split token count."""
    series, _ = run.find(column.metric)
    finite = series.finite() if series is not None else None
    if finite is None or not len(finite):
        return float("nan")
    count = next((c for p, c in SHARE_COUNTS.items() if column.metric.startswith(p)), None)
    weights = run.get(count) if count else None
    if weights is None:
        return column.reduce(finite)
    steps = np.intersect1d(finite.steps, weights.steps)
    share = finite.values[np.searchsorted(finite.steps, steps)]
    n = weights.values[np.searchsorted(weights.steps, steps)]
    keep = np.isfinite(n) & (n > 0)
    return float(np.sum(share[keep] * n[keep]) / np.sum(n[keep])) if keep.any() else float("nan")


def accuracy_values(runs: Sequence[RunData]) -> tuple[list[float], str, int | None]:
    """One accuracy per run, taken where all `runs` can be compared (x100, points).

    The study's primary endpoint: validation accuracy (BF16 generation when every run logged
    it, `compare.accuracy_metrics`) averaged over every validation step after 0 that all runs
    logged; else each run's mean reward over the last `TAIL_STEPS` steps all runs logged; else
    each run's last validation accuracy. Returns (values, what was compared, last step or None).
    """
    for metric, label in (*accuracy_metrics(runs), ("train/reward", "reward")):
        steps, table = align(runs, metric)
        both = np.flatnonzero(np.isfinite(table).all(axis=0) & (steps > 0))
        if both.size:
            validation = metric.startswith("validation/")
            picked = both if validation else both[-TAIL_STEPS:]
            return list(100.0 * table[:, picked].mean(axis=1)), label, int(steps[both[-1]])
    values = []
    for run in runs:
        series, _ = run.find(scores.BF16_ACCURACY)
        finite = series.finite() if series is not None else None
        values.append(
            100.0 * float(finite.values[-1]) if finite is not None and len(finite) else np.nan
        )
    return values, "last validation accuracy of each run (no step common to all)", None


def group_gap(reference: RunGroup, group: RunGroup) -> Gap | None:
    """Accuracy of `group` minus `reference`, in points, paired by seed where possible.

    A run whose accuracy holds a NaN or an infinity is left out (`accuracy_check`): its value
    is NaN here, the other runs are compared on validation accuracy as before, and the reason
    is added to its group's notes. None when either side has no run left to compare."""
    runs = [*reference.runs, *group.runs]
    excluded = excluded_runs(runs, accuracy_metrics(runs)[0][0])
    for i, reason in excluded.items():
        owner = reference if i < len(reference.runs) else group
        if reason not in owner.notes:
            owner.notes.append(reason)
    kept = [r for i, r in enumerate(runs) if i not in excluded]
    kept_values, label, step = accuracy_values(kept) if kept else ([], "", None)
    filled = iter(kept_values)
    values = [np.nan if i in excluded else next(filled) for i in range(len(runs))]
    ref_values, values = values[: len(reference.runs)], values[len(reference.runs) :]
    a, b = reference.keyed(ref_values), group.keyed(values)
    if not np.isfinite(ref_values).any() or not np.isfinite(values).any():
        return None
    interval, paired = stats.difference(a, b)
    names = [runs[i].name for i in sorted(excluded)]
    return Gap(interval, paired, label, step, names)


def _reference_index(summaries: Sequence[GroupSummary]) -> int:
    return next((i for i, s in enumerate(summaries) if s.precision == "bf16"), 0)


def group_verdict(
    ref: GroupSummary,
    summary: GroupSummary,
    gap: Gap | None,
    clip_ratio: stats.Interval | None,
    tolerance_points: float = DEFAULT_TOLERANCE_POINTS,
) -> str:
    """One line: accuracy against the reference (with interval, or the one-run caveat), the
    lower-clip ratio, and entropy surges."""
    who = "BF16" if ref.precision == "bf16" else ref.name
    head = f"{summary.name} ({summary.precision.upper()}, {_seeds_text(summary.seeds)})"
    if gap is None:
        return f"{head}: accuracy not comparable (no validation accuracy or train/reward in both; see the notes)"
    iv = gap.interval
    where = f"{gap.label}" + (f" at step {gap.step}" if gap.step is not None else "")
    if iv.has_interval:
        how = "paired by seed" if gap.paired else "unpaired, different seeds"
        bounds = f"[{iv.low:+.1f}, {iv.high:+.1f}]"
        if iv.contains(0.0):
            accuracy = f"within noise of {who}: {iv.estimate:+.1f} points {bounds}"
        else:
            side = "higher" if iv.estimate > 0 else "lower"
            accuracy = f"{abs(iv.estimate):.1f} points {side} than {who} {bounds}"
        accuracy += f" ({where}, 95 % Student-t interval over n = {iv.n} seeds, {how})"
        if iv.n < 3:
            accuracy += f"; {FEW_SEEDS}"
    else:
        within = abs(iv.estimate) <= tolerance_points
        side = "matches" if within else ("higher than" if iv.estimate > 0 else "lower than")
        rule = f"{'within' if within else 'beyond'} the ±{tolerance_points:g}-point tolerance"
        accuracy = f"{side} {who}: {iv.estimate:+.1f} points ({where}), {rule}; this {ONE_RUN}"
    if gap.excluded:
        accuracy += (
            f"; {', '.join(gap.excluded)} left out: a NaN or infinite accuracy (see the notes)"
        )
    parts = [accuracy]
    if clip_ratio is not None and np.isfinite(clip_ratio.estimate):
        text = stats.format_interval(clip_ratio, "{:.2f}x")  # Fieller; ∞ when unbounded
        parts.append(f"lower-bound clipping of A<0 tokens {text} {who}'s")
    parts.append(
        f"entropy surge (z-score detector) in {summary.surges} of {len(summary.seeds)} run(s)"
    )
    return f"{head}: " + "; ".join(parts)


def _seeds_text(seeds: Sequence[int | None]) -> str:
    known = [str(s) for s in seeds if s is not None]
    label = "seed" if len(seeds) == 1 else f"{len(seeds)} seeds"
    return f"{label} {', '.join(known)}" if known else label


def compare_groups(
    runs: Sequence[RunData],
    tolerance_points: float = DEFAULT_TOLERANCE_POINTS,
) -> GroupComparison:
    """Group `runs` by recipe and compare every group with the reference group.

    Raises:
        ValueError: fewer than two groups (e.g. every run is a seed of the same recipe).
    """
    groups = group_runs(runs)
    if len(groups) < 2:
        raise ValueError(
            f"compare needs runs of two or more recipes; all {len(runs)} run(s) are of "
            f"{groups[0].name if groups else 'nothing'}"
        )
    summaries = [summarize_group(g) for g in groups]
    ref = _reference_index(summaries)
    differences: dict[str, dict[str, tuple[stats.Interval, bool]]] = {}
    ratios: dict[str, dict[str, stats.Interval]] = {}
    gaps: dict[str, Gap | None] = {}
    verdicts = []
    for i, (group, summary) in enumerate(zip(groups, summaries, strict=True)):
        if i == ref:
            continue
        differences[group.name] = {
            c.key: stats.difference(summaries[ref].per_seed[c.key], summary.per_seed[c.key])
            for c in GROUP_COLUMNS
        }
        ratios[group.name] = {
            k: stats.ratio(summaries[ref].per_seed[k], summary.per_seed[k]) for k in RATIO_KEYS
        }
        gaps[group.name] = group_gap(groups[ref], group)
        verdicts.append(
            group_verdict(
                summaries[ref],
                summary,
                gaps[group.name],
                ratios[group.name]["clip_low_neg"],
                tolerance_points,
            )
        )
    comparison = GroupComparison(groups, summaries, ref, differences, ratios, gaps, verdicts)
    comparison.recipe_diff = groups_diff(groups)
    return comparison


def groups_diff(groups: Sequence[RunGroup]) -> RecipeDiff | None:
    """The recipe diff between the groups (one saved recipe each, `grpo.seed` left out, as
    the seed differs by design); None when a group has no run with a saved recipe. Its
    warning says when the groups differ outside precision, refit and calibration."""
    configs = []
    for group in groups:
        config = next((r.config for r in group.runs if r.config), None)
        if config is None:
            return None
        grpo = {k: v for k, v in (config.get("grpo") or {}).items() if k != "seed"}
        configs.append({**config, "grpo": grpo})
    return diff_configs([g.name for g in groups], configs)
