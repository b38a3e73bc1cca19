"""Render a `GroupComparison` (recipes over seeds): terminal table, `report.md`, `report.html`,
and PNG plots with one band per recipe.

Table cells read `mean [low, high] (n=k)` (95 % Student-t interval over k seeds,
`nemo_fp8_rl.analysis.stats`); a difference column per compared recipe gives `mean(b) - mean(a)`, paired
by seed where the same seeds ran. Plots: per step, each recipe's mean over seeds (line) and its
95 % interval (band); noisy per-step training series are smoothed per seed first with an EMA
whose alpha the legend states. As in `nemo_fp8_rl.analysis.report`, plots are described by data first
(`band_data`) and drawn second, and the HTML embeds them.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.compare import align
from nemo_fp8_rl.analysis.groups import EXTRA_COLUMNS, GROUP_COLUMNS, GroupComparison
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
from nemo_fp8_rl.analysis.report import (
    PlotSpec,
    plot_specs,
    print_diff,
    render_diff_html,
    render_diff_markdown,
)
from nemo_fp8_rl.config.safe_files import write_atomic

SPLITS = (  # (key prefix, panel title) of the response-entropy quartile splits
    ("overclip_q", "over-clipped A<0 tokens (FP8 only, shadow steps)"),
    ("clip_lower_q", "lower-clipped A<0 tokens (every step)"),
)


@dataclass(frozen=True)
class Band:
    """One recipe on one panel: per step the mean over seeds and its interval."""

    group: str
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int
    smoothing: str | None

    @property
    def label(self) -> str:
        what = f"{self.group} ({self.seeds} seed{'s' if self.seeds != 1 else ''}"
        what += ", mean, band: 95 % Student-t interval" if self.seeds > 1 else ""
        return what + (f", {self.smoothing})" if self.smoothing else ")")


def table_rows(comparison: GroupComparison) -> tuple[list[str], list[list[str]]]:
    """One row per metric: each recipe's `mean [interval]`, then each difference to the reference."""
    ref = comparison.summaries[comparison.reference]
    others = [s for i, s in enumerate(comparison.summaries) if i != comparison.reference]
    headers = [
        "metric",
        *(f"{s.name} ({s.precision}, n={len(s.seeds)})" for s in comparison.summaries),
    ]
    headers += [f"{s.name} - {ref.name}" for s in others]
    rows = [["seeds", *(_seed_list(s.seeds) for s in comparison.summaries), *("" for _ in others)]]
    for column in GROUP_COLUMNS:
        cells = [_cell(s.stats[column.key], column.fmt) for s in comparison.summaries]
        if all(c == "-" for c in cells):
            continue
        diffs = []
        for s in others:
            interval, paired = comparison.differences[s.name][column.key]
            text = _cell(interval, column.fmt)
            diffs.append(text + (" (paired)" if paired and text != "-" else ""))
        rows.append([column.header, *cells, *diffs])
    rows.append(
        [
            "entropy surges (z-score detector)",
            *(f"{s.surges} of {len(s.seeds)}" for s in comparison.summaries),
        ]
        + ["" for _ in others]
    )
    return headers, rows


def _cell(interval: stats.Interval, template: str) -> str:
    """`mean [low, high] (n=k)`: k seeds had a value."""
    return stats.format_interval(interval, template)


def seed_rows(comparison: GroupComparison) -> tuple[list[str], list[list[str]]]:
    """Each seed's accuracy (the verdict's number) and lower-clip share, for the record."""
    headers = ["recipe", "seed", "last step", "val acc final", "clip<L, A<0"]
    rows = []
    for s in comparison.summaries:
        for i, seed in enumerate(s.seeds):
            key = -1 - i if seed is None else seed
            rows.append(
                [
                    s.name,
                    "?" if seed is None else str(seed),
                    str(s.last_steps[i]),
                    _num(s.per_seed["val_acc_final"].get(key), "{:.3f}"),
                    _num(s.per_seed["clip_low_neg"].get(key), "{:.4f}"),
                ]
            )
    return headers, rows


def _num(value: float | None, template: str) -> str:
    return "-" if value is None or not np.isfinite(value) else template.format(value)


def _seed_list(seeds) -> str:
    return ", ".join("?" if s is None else str(s) for s in seeds)


def band_data(comparison: GroupComparison, spec: PlotSpec) -> list[list[Band]]:
    """For each panel of `spec`, each recipe's band (recipes without the metric left out)."""
    panels = []
    for metric, _ in spec.panels:
        bands = []
        for group in comparison.groups:
            steps, table = align(group.runs, metric)
            if not np.isfinite(table).any():
                continue
            smoothing = None
            if metric in SMOOTHED:
                table = np.stack([stats.ema(row, EMA_ALPHA) for row in table])
                smoothing = f"EMA alpha={EMA_ALPHA}"
            keep = np.isfinite(table).any(axis=0)
            mean, low, high = stats.band(table[:, keep])
            bands.append(Band(group.name, steps[keep], mean, low, high, len(group.runs), smoothing))
        panels.append(bands)
    return panels


def draw_band_plot(spec: PlotSpec, panels: list[list[Band]], names: Sequence[str] = ()):
    """One figure (no pyplot state): per panel a line per recipe and its shaded interval."""

    def draw(ax, metric: str, color: str, b: Band) -> _AsCurve:
        ax.plot(b.steps, b.mean, color=color, lw=1.3, label=b.label)
        if np.isfinite(b.low).any():
            ax.fill_between(b.steps, b.low, b.high, color=color, alpha=0.2, lw=0)
        return _AsCurve(b.mean[np.isfinite(b.mean)])

    names = list(names) or list(dict.fromkeys(b.group for items in panels for b in items))
    return draw_panels(
        spec.title, spec.panels, panels, draw, (5.5, 3.6, 0.3), 7, None, names, lambda b: b.group
    )


@dataclass(frozen=True)
class _AsCurve:
    values: np.ndarray


def draw_overclip_plot(comparison: GroupComparison):
    """Bars per response-entropy quartile: each recipe's mean share of the over-clipped (left)
    and lower-clipped (right) A<0 tokens, with intervals; None when no run logged either."""
    from matplotlib.figure import Figure

    panels = []
    for prefix, title in SPLITS:
        keys = [c.key for c in EXTRA_COLUMNS if c.key.startswith(prefix)]
        if any(np.isfinite(s.stats[k].estimate) for s in comparison.summaries for k in keys):
            panels.append((keys, title))
    if not panels:
        return None
    fig = Figure(figsize=(5.5 * len(panels), 3.8), dpi=100)
    fig.subplots_adjust(
        left=0.1 / len(panels) + 0.04, right=0.98, bottom=0.16, top=0.84, wspace=0.3
    )
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    width = 0.8 / len(comparison.summaries)
    for ax, (keys, title) in zip(axes, panels, strict=True):
        x = np.arange(len(keys))
        for i, s in enumerate(comparison.summaries):
            ivs = [s.stats[k] for k in keys]
            mean = np.array([iv.estimate for iv in ivs])
            err = np.array([[iv.estimate - iv.low, iv.high - iv.estimate] for iv in ivs]).T
            ax.bar(
                x + i * width,
                np.nan_to_num(mean),
                width,
                yerr=np.where(np.isfinite(err), err, 0.0),
                capsize=3,
                label=f"{s.name} (n={len(s.seeds)})",
            )
        ax.set_xticks(x + width * (len(comparison.summaries) - 1) / 2, [f"Q{q + 1}" for q in x])
        ax.set_xlabel("response-entropy quartile in the batch (Q4 highest)")
        ax.set_ylabel("share")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Where the clipping comes from (pooled over steps, mean over seeds, 95 % interval)"
    )
    return fig


def write_plots(comparison: GroupComparison, out_dir: Path) -> dict[str, Path]:
    """Band plots for every `report.plot_specs` entry with data (step time only when every
    run's load allows comparing speed), plus the entropy-quartile bars."""
    from nemo_fp8_rl.analysis.compare import speed_refusal

    runs = [r for g in comparison.groups for r in g.runs]
    comparable = all(speed_refusal(runs[0], r) is None for r in runs[1:])
    panels = {spec: band_data(comparison, spec) for spec in plot_specs(runs, comparable)}
    names = [s.name for s in comparison.summaries]  # one color per recipe in every figure
    figures = {spec.name: draw_band_plot(spec, p, names) for spec, p in panels.items() if any(p)}
    return save_pngs(figures | {"overclip_entropy": draw_overclip_plot(comparison)}, out_dir)


def _notes(comparison: GroupComparison) -> list[str]:
    notes = [n for g in comparison.groups for n in g.notes]
    for g in comparison.groups:
        for run in g.runs:
            notes += run.notes
    return notes


INTRO = (
    "Cells: mean over seeds [95 % Student-t interval] (n = seeds with a value); differences "
    "are paired by seed where the same seeds ran (t-interval of the per-seed differences), "
    "quotients use Fieller's interval (∞ when the denominator is not clearly above 0). Plots: "
    "mean over seeds with its 95 % t band. With 3 seeds the t factor is 4.3: intervals are wide."
)


def render_markdown(
    comparison: GroupComparison, plots: dict[str, Path], runs_report: str | None
) -> str:
    """`report.md` for grouped runs: verdicts, the interval table, per-seed values, plots."""
    title = precision_title([s.precision for s in comparison.summaries])
    lines = [f"# {title}: comparison over seeds", "", "## Verdict", ""]
    lines += [f"- {v}" for v in comparison.verdicts]
    lines += ["", "## Summary", "", INTRO, "", *md_table(*table_rows(comparison)), ""]
    lines += ["## Seeds", "", *md_table(*seed_rows(comparison)), ""]
    notes = _notes(comparison)
    if notes:
        lines += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    if comparison.recipe_diff is not None:
        lines += render_diff_markdown(comparison.recipe_diff, level=2)
    if runs_report:
        lines += [f"Per-run detail (every seed as its own run): [{runs_report}]({runs_report})", ""]
    if plots:
        lines += ["## Plots", "", *(f"![{name}]({p.name})" for name, p in plots.items())]
    return "\n".join(lines) + "\n"


def render_html(
    comparison: GroupComparison, plots: dict[str, Path], runs_report: str | None
) -> str:
    """`report.html`: the Markdown report's content with the PNGs embedded."""
    e = html.escape
    title = e(precision_title([s.precision for s in comparison.summaries]))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title} over seeds</title>"]
    parts.append(
        "<style>body{font-family:sans-serif;max-width:1300px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
        "img{max-width:100%;display:block}</style></head><body>"
    )
    parts.append(f"<h1>{title}: comparison over seeds</h1><h2>Verdict</h2><ul>")
    parts += [f"<li>{e(v)}</li>" for v in comparison.verdicts]
    parts.append(f"</ul><h2>Summary</h2><p>{e(INTRO)}</p>" + html_table(*table_rows(comparison)))
    parts.append("<h2>Seeds</h2>" + html_table(*seed_rows(comparison)))
    notes = _notes(comparison)
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    if comparison.recipe_diff is not None:
        parts += render_diff_html(comparison.recipe_diff)
    if runs_report:
        parts.append(f"<p>Per-run detail: <a href='{e(runs_report)}'>{e(runs_report)}</a></p>")
    for name, path in plots.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<img alt='{e(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    comparison: GroupComparison, out_dir: Path, plots: bool = True, runs_report: str | None = None
) -> tuple[Path, Path, dict[str, Path]]:
    """Write plots, `report.md` and `report.html` into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = write_plots(comparison, out) if plots else {}
    md, page = out / "report.md", out / "report.html"
    write_atomic(md, render_markdown(comparison, pngs, runs_report))
    write_atomic(page, render_html(comparison, pngs, runs_report))
    return md, page, pngs


def print_groups(comparison: GroupComparison, console=None) -> None:
    """The interval table, notes and verdicts in the terminal."""
    from rich.console import Console

    console = console or Console()
    title = precision_title([s.precision for s in comparison.summaries])
    console.print(rich_table(f"{title} over seeds", *table_rows(comparison)))
    console.print(INTRO, highlight=False)
    for note in _notes(comparison):
        console.print(f"  [yellow]{note}[/yellow]", highlight=False)
    if comparison.recipe_diff is not None:
        print_diff(comparison.recipe_diff, console)
    for line in comparison.verdicts:
        console.print(f"[bold green]verdict[/bold green] {line}", highlight=False)
