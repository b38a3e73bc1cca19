"""The comparison report: plot data equals the runs' series, figures draw exactly that, files are complete.

Runs are written by the embedded engine's real `MetricsLogger` (see `test_compare.py`).
"""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from test_compare import expected, write_project_run

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.compare import compare_runs
from nemo_fp8_rl.analysis.render import EMA_ALPHA
from nemo_fp8_rl.analysis.report import (
    MISSING,
    PLOTS,
    draw_plot,
    fmt,
    plot_data,
    print_comparison,
    render_markdown,
    summary_rows,
    write_report,
)
from nemo_fp8_rl.analysis.rundata import load_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def comparison(tmp_path):
    """BF16 (40 steps) vs FP8 (30 of 40 steps, still running) with a surge at step 20."""
    bf16 = write_project_run(tmp_path / "bf16", 40, precision="bf16", acc_final=0.6, step_s=2.0)
    fp8 = write_project_run(
        tmp_path / "fp8",
        30,
        precision="fp8",
        max_num_steps=40,
        acc_final=0.6,
        step_s=1.5,
        surge_at=20,
    )
    lines = (fp8 / "metrics.jsonl").read_text()
    (fp8 / "metrics.jsonl").write_text(lines + '{"step": 31, "train/rew')  # mid-write
    return compare_runs([load_run(bf16), load_run(fp8)])


def _spec(name):
    return next(s for s in PLOTS if s.name == name)


def test_plot_data_is_each_runs_series(comparison):
    reward, accuracy = plot_data(comparison, _spec("reward_accuracy"))
    assert [c.run for c in reward] == ["bf16", "fp8"]
    for curve, steps, kw in (
        (reward[0], 40, {"acc_final": 0.6, "step_s": 2.0}),
        (reward[1], 30, {"acc_final": 0.6, "step_s": 1.5, "surge_at": 20}),
    ):
        want_steps, want = expected(steps, "train/reward", **kw)
        np.testing.assert_array_equal(curve.steps, want_steps)
        np.testing.assert_allclose(curve.values, want)
    assert accuracy[0].steps.tolist() == [10, 20, 30, 40] and accuracy[1].steps.tolist() == [
        10,
        20,
        30,
    ]
    np.testing.assert_allclose(accuracy[1].values, [0.6 * s / 30 for s in (10, 20, 30)])
    (bounds_low, bounds_high) = plot_data(comparison, _spec("calibrated_bounds"))
    assert bounds_low == [] and bounds_high == []  # neither run logged calibration bounds


def test_figure_lines_hold_the_plot_data_and_the_surge_marker(comparison):
    spec = _spec("entropy")
    panels = plot_data(comparison, spec)
    fig = draw_plot(spec, panels, {"fp8": 20})
    (ax,) = fig.axes
    lines = [ln for ln in ax.get_lines() if ln.get_label() in ("bf16", "fp8")]
    faint = [ln for ln in ax.get_lines() if ln.get_alpha() == 0.25]
    for line, raw, curve in zip(lines, faint, panels[0], strict=True):
        np.testing.assert_array_equal(line.get_xdata(), curve.steps)  # the EMA, labelled
        np.testing.assert_allclose(line.get_ydata(), stats.ema(curve.values, EMA_ALPHA))
        np.testing.assert_array_equal(raw.get_ydata(), curve.values)  # per step, faint
        assert raw.get_color() == line.get_color()
    (marker,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert list(marker.get_xdata()) == [20, 20]
    assert marker.get_color() == lines[1].get_color()
    assert ax.get_ylabel() == "entropy (nats per token)"
    assert fig._suptitle.get_text() == "Policy entropy (dotted: detected surge onset)"
    assert draw_plot(spec, panels)._suptitle.get_text() == "Policy entropy"  # none: not promised


def test_empty_panel_says_not_logged(comparison):
    spec = _spec("calibrated_bounds")
    fig = draw_plot(spec, plot_data(comparison, spec))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["train/calib_low\nnot logged", "train/calib_high\nnot logged"]


def test_write_report_files(comparison, tmp_path):
    files = write_report(comparison, tmp_path / "out")
    # calibrated_bounds has no data in either run, so it is not drawn.
    assert sorted(files.plots) == sorted(s.name for s in PLOTS if s.name != "calibrated_bounds")
    for path in files.plots.values():
        assert path.read_bytes().startswith(PNG_MAGIC)
    page = files.html.read_text()
    embedded = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(embedded) == len(files.plots)
    assert {base64.b64decode(e) for e in embedded} == {p.read_bytes() for p in files.plots.values()}
    assert "src='http" not in page and "<link" not in page  # self-contained
    md = files.markdown.read_text()
    for name in files.plots:
        assert f"![{name}]({name}.png)" in md
    assert "entropy surge at step 20" in md and "entropy surge at step 20" in page


def test_markdown_reports_notes_missing_metrics_and_verdict(comparison):
    md = render_markdown(comparison, {})
    assert (
        # mean over the common validations 10-30: 0.6*20/30 - 0.6*20/40 = 10 points
        "- fp8 (FP8): above BF16: +10.0 points on mean validation accuracy after step 0, scored in "
        "rollout precision to step 30, beyond the ±2-point tolerance, 1.33x faster, entropy surge "
        "at step 20 (z-score detector)" in md
    )
    assert "incomplete, last step 30 of 40" in md
    assert "last line 31 is not valid JSON (a run still writing it?)" in md
    assert "missing metrics: train/calib_low, train/calib_high, timing/train/logprobs" in md
    assert "| precision | policy.generation.vllm_cfg.precision | bfloat16 | fp8 |" in md
    assert "## Plots" not in md


def test_summary_rows_format_missing_and_speedup(comparison):
    headers, rows = summary_rows(comparison)
    assert headers == ["metric", "bf16 (bf16)", "fp8 (fp8)"]
    table = {r[0]: r[1:] for r in rows}
    assert table["last step"] == ["40", "30"]
    assert table["L final"] == [MISSING, MISSING]
    assert table["speedup"] == ["1.00x", "1.33x"]
    assert table["entropy surge (z-score detector)"] == ["none", "step 20"]
    assert table["best val step"] == ["40", "30"]
    assert fmt(float("nan"), "{:.2f}") == MISSING and fmt(1.234, "{:.2f}") == "1.23"


def test_terminal_output(comparison):
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    print_comparison(comparison, console)
    text = console.file.getvalue()
    assert "token_mult_prob_error" in text and "1.33x" in text
    assert "verdict fp8 (FP8): above BF16: +10.0 points" in text  # mean 0.6*20/30 vs 0.6*20/40
    assert "Recipe differences: bf16 vs fp8" in text


def test_near_constant_metric_gets_a_readable_axis():
    from nemo_fp8_rl.analysis.report import Curve, PlotSpec

    spec = PlotSpec("bounds", "bounds", (("train/calib_low", "L"),))
    steps = np.arange(1, 4)
    curves = [
        Curve("a", steps, np.full(3, 0.8)),
        Curve("b", steps, 0.8 - np.array([1e-11, 2e-11, 0])),
    ]
    (ax,) = draw_plot(spec, [curves]).axes
    low, high = ax.get_ylim()
    assert low == pytest.approx(0.8 - 0.016) and high == pytest.approx(0.8 + 0.016)
    assert not ax.yaxis.get_major_formatter().get_useOffset()
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_terminal_recipe_diff_lines():
    from rich.console import Console

    from nemo_fp8_rl.analysis.recipe_diff import diff_configs
    from nemo_fp8_rl.analysis.report import print_diff

    diff = diff_configs(
        ["a", "b"],
        [
            {"grpo": {"seed": 1}, "refit": {"verify": True}},
            {"grpo": {"seed": 2}, "refit": {"verify": False}},
        ],
    )
    console = Console(file=io.StringIO(), width=120)
    print_diff(diff, console)
    lines = console.file.getvalue().splitlines()
    assert lines[:5] == [
        "Recipe differences: a vs b",
        "refit",
        "  refit.verify: True -> False",
        "other",
        "  grpo.seed: 1 -> 2",
    ]
    assert lines[5].startswith("warning not a fair precision comparison: 1 key(s)")
