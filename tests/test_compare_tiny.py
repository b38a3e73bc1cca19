"""`compare` on real runs: the tiny BF16 and FP8 recipes run for a few steps by the embedded engine.

Both runs share one Ray instance (started here, so the engine does not start and stop its own).
About two minutes per run on 2 busy CPU cores, hence `slow`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nemo_fp8_rl.analysis.compare import compare_runs
from nemo_fp8_rl.analysis.recipe_diff import precision_of
from nemo_fp8_rl.analysis.report import PLOTS, plot_data, write_report
from nemo_fp8_rl.analysis.rundata import load_run
from nemo_fp8_rl.cli.compare import main

pytestmark = pytest.mark.slow

STEPS = 4
OVERRIDES = [
    f"grpo.max_num_steps={STEPS}",
    "grpo.val_period=2",
    "local.task.num_validation=32",
    "local.warmup.steps=5",
    "local.warmup.target_accuracy=null",
    "local.progress=false",
]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Run directories of the tiny BF16 and FP8 (calibrated) recipes."""
    ray = pytest.importorskip("ray")
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.engines.local import run

    root = tmp_path_factory.mktemp("tiny")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        return [
            run(
                load_recipe(f"tiny/grpo-tiny-qwen3-cpu-{v}", OVERRIDES, run_dir=root / v),
                progress=False,
            )
            for v in ("bf16", "fp8")
        ]
    finally:
        ray.shutdown()


def _jsonl_series(run_dir, metric):
    """The metric's (step, value) pairs straight from metrics.jsonl (null -> NaN)."""
    pairs = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if metric in record:
            pairs[record["step"]] = math.nan if record[metric] is None else record[metric]
    steps = sorted(pairs)
    return np.array(steps), np.array([pairs[s] for s in steps])


def test_real_runs_are_read_from_jsonl_and_tensorboard(tiny_runs):
    for run_dir in tiny_runs:
        run = load_run(run_dir)
        assert run.last_step == STEPS and run.notes == []
        for metric in (
            "train/reward",
            "train/entropy",
            "timing/train/total_step_time",
            "validation/accuracy",
        ):
            steps, values = _jsonl_series(run_dir, metric)
            np.testing.assert_array_equal(run.metrics[metric].steps, steps)
            np.testing.assert_allclose(run.metrics[metric].values, values)
        events = load_run(run_dir / "logs")
        for metric in ("train/reward", "train/token_mult_prob_error", "train/clip_lower_frac_neg"):
            np.testing.assert_allclose(
                events.metrics[metric].values, run.metrics[metric].values, rtol=1e-6
            )
    assert [precision_of(load_run(d).config) for d in tiny_runs] == ["bf16", "fp8"]


def test_real_runs_summary_and_verdict(tiny_runs):
    runs = [load_run(d) for d in tiny_runs]
    comparison = compare_runs(runs)
    bf16, fp8 = comparison.summaries
    _, times = _jsonl_series(tiny_runs[1], "timing/train/total_step_time")
    assert fp8.values["step_time"] == pytest.approx(times[1:].mean())
    _, bf16_times = _jsonl_series(tiny_runs[0], "timing/train/total_step_time")
    assert fp8.values["speedup"] == pytest.approx(bf16_times[1:].mean() / times[1:].mean())
    _, mult = _jsonl_series(tiny_runs[1], "train/token_mult_prob_error")
    assert fp8.values["token_mult_prob_error"] == pytest.approx(np.nanmean(mult))
    assert fp8.values["token_mult_prob_error"] >= 1.0
    for metric in (
        "train/reward",
        "train/entropy",
        "train/clip_lower_frac_neg",
        "train/calib_low",
        "train/gen_kl_error",
    ):
        assert metric not in fp8.missing
    assert comparison.recipe_diff is not None and comparison.recipe_diff.fair
    assert "policy.generation.vllm_cfg.precision" in [
        e.key for e in comparison.recipe_diff.by_group()["precision"]
    ]
    (line,) = comparison.verdicts
    assert line.startswith("fp8 (FP8): ") and (
        "(mean validation accuracy after step 0, BF16-scored, step 4)" in line
    )
    assert "faster" in line or "slower" in line


def test_real_runs_plots_and_report(tiny_runs, tmp_path):
    comparison = compare_runs([load_run(d) for d in tiny_runs])
    entropy_spec = next(s for s in PLOTS if s.name == "entropy")
    (curves,) = plot_data(comparison, entropy_spec)
    for curve, run_dir in zip(curves, tiny_runs, strict=True):
        steps, values = _jsonl_series(run_dir, "train/entropy")
        np.testing.assert_array_equal(curve.steps, steps)
        np.testing.assert_allclose(curve.values, values)
    files = write_report(comparison, tmp_path)
    assert set(files.plots) == {s.name for s in PLOTS}  # the engine logs every plotted metric
    assert all(p.stat().st_size > 5000 for p in files.plots.values())


def test_cli_on_real_runs(tiny_runs, tmp_path, capsys):
    assert main([str(d) for d in tiny_runs] + ["--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict fp8 (FP8):" in out
    assert (tmp_path / "report.html").is_file()
