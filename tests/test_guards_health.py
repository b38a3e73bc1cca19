"""Run health (docs/guard-rails.md): the mismatch against its healthy range, with robust
statistics, flagged after K consecutive steps outside; recorded runs (the committed study
runs) and injected series through both engines' metric paths."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_fp8_rl.guards.health import HealthMonitor, load_table, precision_of, run_health

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "docs" / "study" / "runs"
TMPE = "train/token_mult_prob_error"


def recorded(run: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in gzip.open(STUDY / run / "metrics.jsonl.gz", "rt")]


def feed(precision: str, series: list[float], metric: str = TMPE) -> list[tuple[int, Any]]:
    monitor = HealthMonitor(precision)
    return [(s, e) for s, v in enumerate(series, 1) for e in monitor.observe(s, {metric: v})]


def test_every_threshold_has_a_source_and_robust_statistic():
    raw = yaml.safe_load((ROOT / "nemo_fp8_rl/guards/health_ranges.yaml").read_text())
    for rule in raw["rules"]:
        assert rule["statistic"] in ("median", "share_above")  # never a max
        for precision, spec in rule["limits"].items():
            assert spec["source"], (rule["metric"], precision)
    table = load_table()
    assert table.consecutive == raw["consecutive"] >= 2


def test_a_mismatch_leaving_its_range_is_flagged_after_k_steps():
    """20 steps at BF16's level, then 1.3 from step 21: the 20-step share above 1.1 reaches 0.1
    at step 22 and the 5-step median leaves < 1.1 at step 23; K = 3 such steps in a row make one
    event per rule, at steps 24 and 25 (4 and 5 steps after the jump). Each names the metric,
    value, range, source and causes, once (re-armed only after a return inside)."""
    events = feed("fp8", [1.004] * 20 + [1.3] * 15)
    assert [(s, e.rule.statistic) for s, e in events] == [(24, "share_above"), (25, "median")]
    events = events[1:]
    line = events[0][1].line()
    assert "train/token_mult_prob_error median 1.3 outside the healthy range for fp8" in line
    assert "< 1.1" in line and "PR #3754" in line and "NVIDIA-NeMo/RL#3755" in line
    record = events[0][1].record()
    assert record["step"] == 25 and record["event"]["kind"] == "health"
    assert record["event"]["limit"] == 1.1 and record["event"]["consecutive"] == 3


def test_nan_from_step_2_is_flagged_nemo_rl_1164():
    events = feed("fp8", [1.01] + [math.nan] * 6)
    assert events and events[0][0] <= 6
    assert events[0][1].record()["event"]["value"] is None  # non-finite, kept valid JSON


def test_one_token_spike_is_not_a_health_event_nemo_rl_4080():
    """A passing MXFP8 nightly had one step at 464.6 (PR #4080): robust statistics ignore it."""
    series = [1.25] * 30
    series[17] = 464.6
    assert feed("mxfp8", series) == []
    assert feed("fp8", [1.04] * 17 + [464.6] + [1.04] * 12) == []


def test_committed_study_runs_judged_by_the_table():
    """Recorded runs: the BF16 runs are healthy; FP8 seed 2 (per-tensor scaling) leaves the FP8
    gen_kl_error range at step 12, the same run's single 1.77 step in calibrated seed 1 does not
    count."""
    for seed in (1, 2, 3, 5, 6):
        assert run_health(recorded(f"grpo-study-bf16/seed-{seed}"), "bf16").healthy
    monitor = HealthMonitor("fp8")
    flagged = [
        (r["step"], e.rule.metric)
        for r in recorded("grpo-study-fp8-uncalibrated/seed-2")
        for e in monitor.observe(r["step"], r)
    ]
    assert flagged[0] == (12, "train/gen_kl_error")
    calibrated = HealthMonitor("fp8")
    spiky = recorded("grpo-study-fp8/seed-1")
    assert max(r.get(TMPE, 0) for r in spiky) > 1.7
    assert not [e for r in spiky for e in calibrated.observe(r["step"], r) if e.rule.metric == TMPE]


def test_precision_classes_follow_the_recipe():
    from nemo_fp8_rl.config import load_recipe

    assert precision_of(load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16").config) == "bf16"
    assert precision_of(load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8").config) == "fp8"
    assert (
        precision_of(load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache").config)
        == "fp8_kv"
    )
    mx = load_recipe(
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16",
        [
            "policy.generation.vllm_cfg.precision=fp8",
            "policy.generation.vllm_cfg.is_mx=true",
            "policy.generation.vllm_cfg.pow2_weight_scaling_factors=true",
            "policy.generation.vllm_cfg.pow2_activation_scaling_factors=true",
            "loss_fn.use_importance_sampling_correction=true",
            "refit.precision_split=true",  # MXFP8 generation over BF16 training, declared
        ],
    )
    assert precision_of(mx.config) == "mxfp8"


class RecordingNemoLogger:
    """Recorder named as such: stands in for NeMo RL's `Logger` (TensorBoard/W&B backends)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, int, str]] = []

    def log_metrics(self, metrics: dict, step: int, prefix: str = "") -> None:
        self.calls.append((metrics, step, prefix))


def test_nemo_rl_engine_metrics_path_flags_and_records_the_event(tmp_path, capsys):
    """NeMo RL's loop logs per prefix (`train`, `timing`, several calls a step); the tee's
    monitor counts steps of the metric, prints one line and writes the event after the step's
    row; a resumed run replays the file and does not repeat it."""
    from nemo_fp8_rl.engines.nemo.driver.metrics_log import MetricsTee, health_monitor

    path = tmp_path / "metrics.jsonl"
    config = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}, "megatron_cfg": {}}}
    inner = RecordingNemoLogger()
    tee = MetricsTee(inner, path, health_monitor(config, path))
    for step in range(1, 13):
        value = 1.003 if step < 6 else 1.6  # the injected series: mismatch leaves at step 6
        tee.log_metrics({"token_mult_prob_error": value, "gen_kl_error": 1e-4}, step, "train")
        tee.log_metrics({"train": {"total_step_time": 1.0}}, step, "timing")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    events = [r for r in lines if "event" in r]
    assert [e["step"] for e in events] == [10]
    assert events[0]["event"]["metric"] == TMPE and events[0]["event"]["precision"] == "fp8"
    assert capsys.readouterr().out.count("health: step 10: train/token_mult_prob_error") == 1
    assert len(inner.calls) == 24  # NeMo RL's own backends get every call unchanged
    resumed = MetricsTee(RecordingNemoLogger(), path, health_monitor(config, path))
    resumed.log_metrics({"token_mult_prob_error": 1.6}, 13, "train")
    assert sum("event" in json.loads(x) for x in path.read_text().splitlines()) == 1


def test_summary_and_compare_report_each_runs_health_and_the_bf16_floor(tmp_path):
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.rundata import load_run
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.runs.summary import health_line

    runs = {}
    for variant, tmpe, kl in (("bf16", 1.004, 1e-5), ("fp8", 1.3, 0.003)):
        run = tmp_path / variant
        run.mkdir()
        (run / "recipe.yaml").write_text(
            load_recipe(f"tiny/grpo-tiny-qwen3-cpu-{variant}").to_yaml()
        )
        monitor = HealthMonitor("bf16" if variant == "bf16" else "fp8")
        rows = []
        for step in range(1, 11):
            row = {
                "step": step,
                TMPE: tmpe,
                "train/gen_kl_error": kl,
                "train/clip_lower_frac_neg": 0.01 if variant == "bf16" else 0.08,
            }
            rows.append(row)
            rows += [e.record() for e in monitor.observe(step, row)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[variant] = run
    records = [json.loads(x) for x in (runs["fp8"] / "metrics.jsonl").read_text().splitlines()]
    line = health_line(runs["fp8"], records)
    assert "UNHEALTHY (2 statistic(s) out of range)" in line  # median 1.3 and share 1.0
    assert "token_mult_prob_error median 1.3 (OUT < 1.1)" in line
    assert health_line(runs["bf16"], []).startswith("health (bf16, over all steps): healthy")
    comparison = compare_runs([load_run(runs["bf16"]), load_run(runs["fp8"])])
    bf16_notes, fp8_notes = (s.notes for s in comparison.summaries)
    assert any(n.startswith("health (bf16, over all steps): healthy") for n in bf16_notes)
    assert any("UNHEALTHY" in n for n in fp8_notes)
    floor = next(n for n in fp8_notes if n.startswith("BF16 control"))
    assert "token_mult_prob_error median 1.3 vs control floor 1.004" in floor
    assert "clip_lower_frac_neg 8x the control's (above 4x" in floor


@pytest.mark.slow
def test_embedded_engine_flags_a_real_run_outside_the_range(tmp_path, capsys):
    """The study's per-tensor FP8 recipe, seed 2, on the embedded engine: its gen_kl_error
    median leaves the FP8 range (< 0.004) by step 12 (as its committed run did)."""
    from nemo_fp8_rl.cli.train import main

    run = tmp_path / "run"
    assert (
        main(
            [
                "--recipe",
                "study/grpo-study-fp8-uncalibrated",
                "--run-dir",
                str(run),
                "--no-progress",
                "grpo.seed=2",
                "grpo.max_num_steps=14",
                "grpo.val_period=14",
                "checkpointing.enabled=false",
            ]
        )
        == 0
    )
    events = [
        json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"event"' in x
    ]
    assert (
        events and events[0]["event"]["metric"] == "train/gen_kl_error" and events[0]["step"] <= 14
    )
    assert "health (fp8): UNHEALTHY" in capsys.readouterr().out


# ---- the run's verdict is the statistics it prints ---------------------------------------------


def _run(kl: list[float], tmpe: float = 1.01) -> list[dict[str, Any]]:
    return [{"step": s, TMPE: tmpe, "train/gen_kl_error": v} for s, v in enumerate(kl, 1)]


def test_a_transient_window_is_an_episode_with_its_steps_not_the_verdict():
    """150 steps of FP8 gen_kl_error at 0.001 with a 3-step jump to 0.01 at steps 138-140: the
    5-step median is outside at 140-142 (K = 3: one event at 142), back at 143; the run's median
    is 0.001, so the run is healthy and the window is listed with its steps."""
    kl = [0.001] * 150
    kl[137:140] = [0.01] * 3
    health = run_health(_run(kl), "fp8", "local")
    assert health.healthy and health.outside == []
    assert [(e.first, e.last, e.back) for e in health.episodes] == [(140, 142, 143)]
    line = health.line()
    assert line.startswith("health (fp8, over all steps): healthy: ")
    assert "gen_kl_error median 0.001 (OK < 0.004)" in line
    assert (
        "1 window outside: gen_kl_error median over 5 steps outside < 0.004 at steps 140-142"
        in line
    )
    assert "back in range at step 143" in line and "UNHEALTHY" not in line


def test_the_verdict_is_unhealthy_exactly_when_a_printed_statistic_is_out():
    """Over many shapes of series, `healthy` is True exactly when every statistic the line prints
    is OK, and the line says UNHEALTHY exactly when one says OUT."""
    import random

    rng = random.Random(7)
    for trial in range(60):
        level = rng.choice([0.001, 0.003, 0.005, 0.02])
        kl = [abs(rng.gauss(level, level / 2)) for _ in range(rng.randint(5, 80))]
        tmpe = rng.choice([1.01, 1.09, 1.2])
        health = run_health(_run(kl, tmpe), "fp8", "local")
        line = health.line()
        stats_ok = all(v is None or not r.outside(v) for r, v in health.stats)
        assert health.healthy == stats_ok, (trial, line)
        assert ("UNHEALTHY" in line) == ("(OUT <" in line), (trial, line)


def test_causes_are_those_of_the_engine_that_ran():
    """The embedded engine has no vLLM and no NeMo RL FP8 patches: its events and its unhealthy
    verdict name only causes that can apply to it; NeMo RL's name NeMo RL's."""
    series = [1.004] * 20 + [1.3] * 15
    local = HealthMonitor("fp8", engine="local")
    nemo = HealthMonitor("fp8", engine="nemo")
    local_events = [e for s, v in enumerate(series, 1) for e in local.observe(s, {TMPE: v})]
    nemo_events = [e for s, v in enumerate(series, 1) for e in nemo.observe(s, {TMPE: v})]
    assert local_events and nemo_events
    assert all("NeMo RL's FP8 patches" not in c for e in local_events for c in e.causes)
    assert all("scale formats mixed" not in c for e in local_events for c in e.causes)
    assert any("emulated format's own rounding" in c for c in local_events[0].causes)
    assert any("NeMo RL's FP8 patches" in c for c in nemo_events[0].causes)
    line = run_health(_run([0.001] * 35, 1.3), "fp8", "local").line()
    assert "UNHEALTHY" in line and "likely causes: " in line and "NeMo RL" not in line
