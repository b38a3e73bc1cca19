"""Render a `Comparison`: a terminal table (rich), `report.md`, a self-contained `report.html`, PNG plots.

The tables are built once as rows of strings (`summary_rows`, `diff_rows`) and written three
ways, so the terminal, Markdown and HTML always agree. Plots are described by data first
(`plot_data`: for each panel, each run's steps and values, exactly as read) and drawn second
(`draw_plot`), so tests can check what a figure shows without reading pixels. matplotlib is
imported only when a plot is drawn: it costs about a second, more than reading two long runs.
The HTML embeds the PNGs as base64 data URIs, so the one file can be mailed or attached.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.compare import COLUMNS, SPEEDUP_HEADER, Comparison
from nemo_fp8_rl.analysis.recipe_diff import RecipeDiff
from nemo_fp8_rl.analysis.render import (
    EMA_ALPHA,
    SMOOTHED,
    draw_panels,
    html_table,
    md_table,
    precision_title,
    rich_table,
    save_pngs,
)
from nemo_fp8_rl.analysis.surge import RULE
from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.runs import scores

MISSING = "-"
SURGE_NOTE = (
    f"Entropy surge: {RULE} (nemo_fp8_rl/analysis/surge.py), the rule of this report and of the "
    "note at the end of an embedded run. The CPU studies' entropy endpoint is another statistic, "
    "the largest rise above the trailing 20-step minimum, judged over seeds against a threshold "
    "of their own (docs/study/)."
)


@dataclass(frozen=True)
class PlotSpec:
    """One PNG: a file stem, a title, and one panel per (metric, axis label)."""

    name: str
    title: str
    panels: tuple[tuple[str, str], ...]


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward_accuracy",
        "Reward and validation accuracy",
        (
            ("train/reward", "reward"),
            # BF16-generation score; the rollout engine's where a run lacks it (`runs.scores`)
            (scores.BF16_ACCURACY, "validation accuracy"),
        ),
    ),
    PlotSpec("entropy", "Policy entropy", (("train/entropy", "entropy (nats per token)"),)),
    PlotSpec(
        "clip_lower_neg",
        "Lower-bound clipping of A<0 tokens",
        (("train/clip_lower_frac_neg", "share of A<0 tokens below L"),),
    ),
    PlotSpec(
        "calibrated_bounds",
        "Clip bounds in force",
        (
            ("train/calib_low", "L, lower bound of the ratio"),
            ("train/calib_high", "H, upper bound"),
        ),
    ),
    PlotSpec(
        "mismatch",
        "Rollout / trainer mismatch",
        (
            ("train/token_mult_prob_error", "mean exp|Δ log p| (1 = none)"),
            ("train/gen_kl_error", "KL(gen ‖ train) per token"),
        ),
    ),
    PlotSpec("step_time", "Step time", (("timing/train/total_step_time", "seconds per step"),)),
)


@dataclass(frozen=True)
class Curve:
    """One run's line on one panel."""

    run: str
    steps: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class ReportFiles:
    """Paths written by `write_report`."""

    markdown: Path
    html: Path
    plots: dict[str, Path]


def fmt(value: float, template: str) -> str:
    """Format a number with `template`; NaN (a missing metric) shows as `MISSING`."""
    return MISSING if value is None or not math.isfinite(value) else template.format(value)


def summary_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The summary transposed for reading: one row per metric, one column per run."""
    headers = ["metric", *(f"{s.name} ({s.precision})" for s in comparison.summaries)]
    rows = [["last step", *(str(s.last_step) for s in comparison.summaries)]]
    for column in COLUMNS:
        rows.append(
            [column.header, *(fmt(s.values[column.key], column.fmt) for s in comparison.summaries)]
        )
        if column.key == "val_acc_best":
            rows.append(
                [
                    "best val step",
                    *(
                        MISSING if s.best_val_step is None else str(s.best_val_step)
                        for s in comparison.summaries
                    ),
                ]
            )
    rows.append(
        [SPEEDUP_HEADER, *(fmt(s.values["speedup"], "{:.2f}x") for s in comparison.summaries)]
    )
    rows.append(
        [
            "entropy surge (z-score detector)",
            *(
                "none" if s.surge_step is None else f"step {s.surge_step}"
                for s in comparison.summaries
            ),
        ]
    )
    return headers, rows


def diff_rows(diff: RecipeDiff) -> tuple[list[str], list[list[str]]]:
    """Recipe differences as rows `group | key | value per config`."""
    headers = ["group", "key", *diff.names]
    rows = [
        [group, e.key, *(str(v) for v in e.values)]
        for group, entries in diff.by_group().items()
        for e in entries
    ]
    return headers, rows


def plot_data(comparison: Comparison, spec: PlotSpec) -> list[list[Curve]]:
    """For each panel of `spec`, each run's finite points of its metric (runs lacking it left out)."""
    panels = []
    for metric, _ in spec.panels:
        curves = []
        for run in comparison.runs:
            series, _ = run.find(metric)
            if series is not None and len(series.finite()):
                finite = series.finite()
                curves.append(Curve(run.name, finite.steps, finite.values))
        panels.append(curves)
    return panels


def draw_plot(
    spec: PlotSpec,
    panels: list[list[Curve]],
    surges: dict[str, int] | None = None,
    names: Sequence[str] = (),
):
    """Draw one figure (a `matplotlib.figure.Figure`, no pyplot state) from `plot_data` output.

    A noisy series (`SMOOTHED`) is drawn as its EMA over the per-step values, drawn faint behind
    it. `surges` maps run name to surge step, drawn as a dotted vertical line on the entropy
    panel; the title says so only when one is drawn. `names` (default: the runs in the order
    drawn) fixes each run's color, the same in every figure of a report.
    """
    surges = surges or {}

    def draw(ax, metric: str, color: str, curve: Curve) -> Curve:
        smooth = metric in SMOOTHED and curve.steps.size >= 10
        if smooth:
            ax.plot(curve.steps, curve.values, color=color, lw=0.7, alpha=0.25)
            ax.set_title(f"EMA α = {EMA_ALPHA}; faint: per step", fontsize=8)
        values = stats.ema(curve.values, EMA_ALPHA) if smooth else curve.values
        ax.plot(
            curve.steps,
            values,
            label=curve.run,
            color=color,
            lw=1.3,
            marker="o" if curve.steps.size < 30 else None,
            ms=3,
        )
        if metric == "train/entropy" and curve.run in surges:
            ax.axvline(surges[curve.run], color=color, ls=":", lw=1.2)
        return curve

    drawn = {c.run for items in panels for c in items}
    title = spec.title
    if spec.name == "entropy" and drawn & set(surges):
        title += " (dotted: detected surge onset)"
    names = list(names) or list(dict.fromkeys(c.run for items in panels for c in items))
    return draw_panels(
        title, spec.panels, panels, draw, (5.0, 3.4, 0.32), 8, "gray", names, lambda c: c.run
    )


def accuracy_axis(runs: Sequence) -> str:
    """The validation-accuracy axis label, naming how the runs drawn were scored: BF16
    generation, or the rollout engine's precision (NeMo RL runs, older runs)."""
    found = {r.find(scores.BF16_ACCURACY)[1] for r in runs} - {None}
    if found == {scores.BF16_ACCURACY}:
        return "validation accuracy\n(BF16-scored)"
    if found == {scores.ROLLOUT_ACCURACY}:
        return "validation accuracy\n(rollout precision: FP8 for FP8 runs)"
    return "validation accuracy (BF16-scored,\nrollout precision where not logged)"


def plot_specs(runs: Sequence, speed_comparable: bool) -> list[PlotSpec]:
    """`PLOTS` for these runs: the accuracy axis says how they were scored, and the step-time
    plot is left out when the verdict refuses to compare speed (it would measure the load)."""
    specs = []
    for spec in PLOTS:
        if spec.name == "step_time" and not speed_comparable:
            continue
        panels = tuple(
            (m, accuracy_axis(runs) if m == scores.BF16_ACCURACY else label)
            for m, label in spec.panels
        )
        specs.append(PlotSpec(spec.name, spec.title, panels))
    return specs


def write_plots(comparison: Comparison, out_dir: Path) -> dict[str, Path]:
    """Draw every `plot_specs` entry that at least one run has data for; returns name -> PNG
    path. Step time is drawn only when every run's speed may be compared with the reference."""
    from nemo_fp8_rl.analysis.compare import speed_refusal

    surges = {s.name: s.surge_step for s in comparison.summaries if s.surge_step is not None}
    ref = comparison.runs[comparison.reference]
    comparable = all(speed_refusal(ref, r) is None for r in comparison.runs if r is not ref)
    panels = {spec: plot_data(comparison, spec) for spec in plot_specs(comparison.runs, comparable)}
    names = [r.name for r in comparison.runs]
    return save_pngs(
        {spec.name: draw_plot(spec, p, surges, names) for spec, p in panels.items() if any(p)},
        out_dir,
    )


def _run_lines(comparison: Comparison) -> list[tuple[str, list[str]]]:
    """Per run: a description and its notes (missing metrics, skipped lines, incomplete runs)."""
    out = []
    for run, s in zip(comparison.runs, comparison.summaries, strict=True):
        notes = list(s.notes)
        if s.missing:
            notes.append("missing metrics: " + ", ".join(s.missing))
        out.append((f"{s.name}: {s.precision}, last step {s.last_step}, {run.path}", notes))
    return out


def render_markdown(comparison: Comparison, plots: dict[str, Path]) -> str:
    """`report.md`: verdicts, runs and notes, summary table, recipe diff, plots (relative links)."""
    title = precision_title([s.precision for s in comparison.summaries])
    lines = [f"# {title}: comparison", "", "## Verdict", ""]
    lines += [f"- {v}" for v in comparison.verdicts] or ["- no FP8 run to judge"]
    lines += ["", "## Runs", ""]
    for head, notes in _run_lines(comparison):
        lines.append(f"- {head}")
        lines += [f"  - {n}" for n in notes]
    lines += ["", "## Summary", "", *md_table(*summary_rows(comparison)), "", SURGE_NOTE, ""]
    lines += render_diff_markdown(comparison.recipe_diff, level=2)
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{name}]({path.name})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def render_diff_markdown(diff: RecipeDiff | None, level: int = 1) -> list[str]:
    """The recipe-diff section as Markdown lines (or a line saying it is unavailable)."""
    hashes = "#" * level
    if diff is None:
        return [
            f"{hashes} Recipe differences",
            "",
            "Not available: not every run saved its recipe.yaml.",
            "",
        ]
    lines = [f"{hashes} Recipe differences: {' vs '.join(diff.names)}", ""]
    lines += [f"> **Warning:** {w}" for w in diff.warnings]
    lines += [f"> {n}" for n in diff.notes]
    lines += (
        ["", *md_table(*diff_rows(diff))]
        if diff.entries
        else ["The resolved configs are identical."]
    )
    return [*lines, ""]


_CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
    "th{background:#f3f3f3}.warn{color:#a40}img{max-width:100%;display:block;margin:1em 0}"
)


def render_html(comparison: Comparison, plots: dict[str, Path]) -> str:
    """`report.html`: the Markdown report's content, with every PNG embedded as a data URI."""
    e = html.escape
    title = e(precision_title([s.precision for s in comparison.summaries]))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style></head><body>"
    ]
    parts.append(f"<h1>{title}: comparison</h1><h2>Verdict</h2><ul>")
    parts += [f"<li>{e(v)}</li>" for v in comparison.verdicts] or ["<li>no FP8 run to judge</li>"]
    parts.append("</ul><h2>Runs</h2><ul>")
    for head, notes in _run_lines(comparison):
        parts.append(
            f"<li>{e(head)}<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul></li>"
        )
    parts.append("</ul><h2>Summary</h2>" + html_table(*summary_rows(comparison)))
    parts.append(f"<p>{e(SURGE_NOTE)}</p>")
    parts += render_diff_html(comparison.recipe_diff)
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, path in plots.items():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            parts.append(f"<img alt='{e(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_diff_html(diff: RecipeDiff | None) -> list[str]:
    """The recipe-diff section as HTML parts (or a line saying it is unavailable)."""
    parts = ["<h2>Recipe differences</h2>"]
    if diff is None:
        return [*parts, "<p>Not available: not every run saved its recipe.yaml.</p>"]
    parts += [f"<p class='warn'>Warning: {html.escape(w)}</p>" for w in diff.warnings]
    parts.append(
        html_table(*diff_rows(diff))
        if diff.entries
        else "<p>The resolved configs are identical.</p>"
    )
    return parts


def write_report(comparison: Comparison, out_dir: str | Path, plots: bool = True) -> ReportFiles:
    """Write the PNG plots, `report.md` and `report.html` into `out_dir` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = write_plots(comparison, out) if plots else {}
    md, page = out / "report.md", out / "report.html"
    write_atomic(md, render_markdown(comparison, pngs))
    write_atomic(page, render_html(comparison, pngs))
    return ReportFiles(md, page, pngs)


def print_comparison(comparison: Comparison, console=None) -> None:
    """Print the summary table, the verdicts and run notes to the terminal with rich."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    title = precision_title([s.precision for s in comparison.summaries])
    console.print(rich_table(title, *summary_rows(comparison)))
    for head, notes in _run_lines(comparison):
        console.print(f"[bold]{escape(head)}[/bold]", highlight=False)
        for note in notes:
            console.print(f"  [yellow]{escape(note)}[/yellow]", highlight=False)
    if comparison.recipe_diff is not None:
        print_diff(comparison.recipe_diff, console)
    for line in comparison.verdicts:
        console.print(f"[bold green]verdict[/bold green] {escape(line)}", highlight=False)


def print_diff(diff: RecipeDiff, console=None) -> None:
    """Print a recipe diff grouped by precision / refit / calibration / other / derived.

    One line per key (`key: a -> b`, or `a | b | c` for more configs) reads better than a table
    in a terminal: keys are long and a table would wrap them.
    """
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    console.print(f"[bold]Recipe differences:[/bold] {escape(' vs '.join(diff.names))}")
    if not diff.entries:
        console.print("  the resolved configs are identical")
    joiner = " -> " if len(diff.names) == 2 else " | "
    for group, entries in diff.by_group().items():
        console.print(f"[bold cyan]{group}[/bold cyan]")
        for e in entries:
            values = joiner.join(str(v) for v in e.values)
            console.print(f"  {escape(e.key)}: {escape(values)}", highlight=False, soft_wrap=True)
    for note in diff.notes:
        console.print(f"[bold]note[/bold] {escape(note)}", highlight=False)
    for warning in diff.warnings:
        console.print(f"[bold red]warning[/bold red] {escape(warning)}", highlight=False)
