"""Rendering helpers both reports share: Markdown, HTML and rich tables, matplotlib panels and their PNG files.

Plain functions over strings and arrays; matplotlib and rich are imported only when a figure or a
console table is drawn.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from nemo_fp8_rl.config.safe_files import write_atomic


class HasValues(Protocol):
    """Anything drawn on a panel: a curve or a band, with the values its y range must show."""

    values: np.ndarray


T = TypeVar("T")


# Per-step series noisy enough to be drawn smoothed (an EMA, with the raw series faint behind it
# in single-run plots); both reports use these.
EMA_ALPHA = 0.2
SMOOTHED = (
    "train/reward",
    "train/entropy",
    "train/clip_lower_frac_neg",
    "train/clip_upper_frac_pos",
    "train/clip_dual_frac_neg",
    "train/token_mult_prob_error",
    "train/gen_kl_error",
)


# Metrics drawn on the whole [0, 1] axis when every value lies in it: a range cut to the data
# would magnify a single seed's noise into a slope.
UNIT_RANGE = ("validation/bf16_accuracy", "validation/accuracy", "train/reward")


def unit_range(ax, metric: str, items: Sequence[HasValues]) -> None:
    """Show the whole [0, 1] for an accuracy or reward panel whose values all lie in it."""
    values = [np.asarray(i.values, dtype=float) for i in items]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
    if metric in UNIT_RANGE and finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
        ax.set_ylim(-0.02, 1.02)


def title_size(title: str, width_in: float, largest: float = 12.0) -> float:
    """A suptitle font size (points) at which `title` fits `width_in` inches: a character is
    about 0.6 em wide, and a tenth of the width is left as margin."""
    return min(largest, 0.9 * width_in * 72.0 / (0.6 * max(len(title), 1)))


def precision_title(precisions: Sequence[str]) -> str:
    """A report's title from its runs' precisions, in order of first appearance: "BF16 vs FP8",
    "BF16 runs" when all share one precision."""
    names = list(dict.fromkeys(p.upper() for p in precisions))
    return f"{names[0]} runs" if len(names) == 1 else " vs ".join(names)


def panel_figure(n: int, width: float, height: float, wspace: float, legend_rows: int = 0):
    """A figure (no pyplot state) with `n` panels side by side, each `width` x `height` inches,
    and room below them for a legend of `legend_rows` rows.

    Fixed margins: constrained/tight layout would cost an extra draw per figure."""
    from matplotlib.figure import Figure

    extra = 0.22 * legend_rows  # inches of legend below the x-axis label
    fig = Figure(figsize=(width * n, height + extra), dpi=100)
    total = height + extra
    fig.subplots_adjust(
        left=0.14 / n + 0.04,
        right=0.98,
        bottom=(0.15 * height + extra + 0.05 * bool(legend_rows)) / total,
        top=1 - 0.14 * height / total,
        wspace=wspace,
    )
    return fig, fig.subplots(1, n, squeeze=False)[0]


def style_axes(ax, curves: Sequence[HasValues]) -> None:
    """Integer steps; plain tick labels; a near-constant metric gets a readable y range.

    Without this, bounds that sit at 0.8 +/- 1e-11 are drawn as "1e-11 + 7.999999999e-1" with
    the rounding noise filling the panel.
    """
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False)
    values = np.concatenate([c.values for c in curves]) if curves else np.zeros(0)
    if values.size:
        low, high = float(values.min()), float(values.max())
        floor = 1e-3 * max(abs(low), abs(high), 1e-9)
        if high - low < floor:
            center = 0.5 * (low + high)
            pad = max(0.02 * abs(center), 1e-12)
            ax.set_ylim(center - pad, center + pad)


def draw_panels(
    title: str,
    labels: Sequence[tuple[str, str]],
    panels: Sequence[Sequence[T]],
    draw: Callable[[Any, str, str, T], HasValues],
    size: tuple[float, float, float],
    legend_size: int,
    empty_color: str | None = None,
    names: Sequence[str] = (),
    name_of: Callable[[T], str] | None = None,
):
    """A figure with one panel per `(metric, y label)` of `labels`, step on the x axis.

    `draw(ax, metric, color, item)` draws one item of a panel in its color and returns the
    values the y range must show (`style_axes`); a panel without items says its metric was not
    logged. An item's color is that of its name (`name_of(item)`) in `names`, so a run or a
    recipe keeps one color in every panel and figure, whichever panels it is missing from. The
    legend is one, below the panels, where it covers no data. `size`: each panel's width and
    height (inches) and the spacing.
    """
    order = list(names)

    def color(index: int, item: T) -> str:
        name = name_of(item) if name_of is not None else None
        return f"C{order.index(name)}" if name in order else f"C{index}"

    width = max((len(items) for items in panels), default=0)
    if name_of is not None:  # the legend lists each name once, whichever panels it is on
        width = len({name_of(item) for items in panels for item in items})
    columns = min(max(width, 1), 3)
    fig, axes = panel_figure(len(panels), *size, legend_rows=-(-width // columns))
    for ax, (metric, label), items in zip(axes, labels, panels, strict=True):
        drawn = [draw(ax, metric, color(i, item), item) for i, item in enumerate(items)]
        style_axes(ax, drawn)
        unit_range(ax, metric, drawn)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        if not items:
            ax.text(
                0.5,
                0.5,
                f"{metric}\nnot logged",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color=empty_color,
            )
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(text, handle)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="lower center",
            ncol=columns,
            fontsize=legend_size,
            frameon=False,
        )
    fig.suptitle(title, fontsize=title_size(title, fig.get_figwidth()))
    return fig


def save_pngs(figures: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write each figure as `<out_dir>/<name>.png` (a `None` figure is skipped); name -> path."""
    written = {}
    for name, fig in figures.items():
        if fig is not None:
            path = out_dir / f"{name}.png"
            buffer = io.BytesIO()  # rendered here, written by the one safe writer
            fig.savefig(
                buffer, format="png", pil_kwargs={"compress_level": 3}
            )  # safe-write: buffer
            write_atomic(path, buffer.getvalue())
            written[name] = path
    return written


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, one line per row; `|` inside a cell is escaped."""
    cells = [headers, ["---"] * len(headers), *rows]
    return ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]


def html_table(headers: list[str], rows: list[list[str]]) -> str:
    """An HTML table with every cell escaped."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def rich_table(title: str, headers: list[str], rows: list[list[str]]):
    """A `rich.table.Table` for the console; long cells fold instead of being cut."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table
