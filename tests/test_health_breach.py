"""`health.on_breach: stop` on the embedded engine: a real breach (the recipe's range for
`token_mult_prob_error` set below its healthy value) saves a checkpoint, stops the run with the
located error, and the printed command resumes it; `warn` keeps going; bad keys are refused."""

from __future__ import annotations

import json
import time

import pytest
from tiny_fast import TWO_STEPS

from nemo_fp8_rl.cli import train
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import RecipeError, load_recipe
from nemo_fp8_rl.guards.breach import HealthBreach, health_table, helpful_overrides

FP8 = "tiny/grpo-tiny-qwen3-cpu-fp8-uncalibrated"
METRIC = "train/token_mult_prob_error"
BREACH = [  # K = 3 steps outside a 5-step median: the first event comes at step 5
    *[
        o
        for o in TWO_STEPS
        if not o.startswith(("grpo.max_num_steps", "checkpointing.save_period"))
    ],
    "grpo.max_num_steps=8",
    "checkpointing.save_period=100",
    "health.limits={train/token_mult_prob_error: 0.5}",
]


def test_a_recipe_range_replaces_the_published_limit_and_bad_keys_are_refused():
    cfg = load_recipe(FP8, ["health.limits={train/token_mult_prob_error: 0.5}"]).config
    (rule,) = [
        r for r in health_table(cfg).rules["fp8"] if r.metric == METRIC and r.statistic == "median"
    ]
    assert rule.limit == 0.5 and rule.source == "this recipe's health.limits"
    with pytest.raises(RecipeError, match="not judged by its median"):
        load_recipe(FP8, ["health.limits={train/nope: 1}"])
    with pytest.raises(RecipeError, match="health.on_breach"):
        load_recipe(FP8, ["health.on_breach=halt"])
    cfg = load_recipe(FP8).config
    assert [h.split(":")[0] for h in helpful_overrides(cfg)] == ["FP8 only in the rollout", "BF16"]
    cfg["loss_fn"]["use_importance_sampling_correction"] = False  # e.g. a NeMo RL config as is
    assert helpful_overrides(cfg)[0].startswith("importance-sampling correction: loss_fn.use_")


def test_stop_on_a_real_breach_checkpoints_names_the_rule_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [
        "--recipe",
        FP8,
        "--run-dir",
        str(run),
        "--no-progress",
        *BREACH,
        "health.on_breach=stop",
    ]
    start = time.perf_counter()
    with pytest.raises(HealthBreach) as caught:
        train.main(argv)
    took = time.perf_counter() - start
    err = caught.value
    assert err.event.step == 5 and err.code == 1
    text = str(err)
    assert f"stopped by health.on_breach: stop: {METRIC} median" in text
    assert "median over 5 steps < 0.5; source: this recipe's health.limits) for 3 steps" in text
    assert "resume with: nemo_fp8_rl.train --recipe " in text
    assert f"--run-dir {run} --resume health.on_breach=warn" in text
    assert (run / "checkpoints" / "step_5").is_dir() and "BF16" in text
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 5 and any("event" in r for r in rows)
    print(f"breach to stop: {err.seconds:.2f} s (the whole run {took:.0f} s)")
    assert err.seconds < 60
    # the printed command resumes from the checkpoint; with warn the run goes to its end
    assert invoke(train.main, [*argv[:-1], "health.on_breach=warn", "--resume"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 8
    capsys.readouterr()


def test_nemo_rls_loop_stops_at_the_first_checkpoint_after_the_breach(tmp_path, capsys):
    """On NeMo RL's loop the `train/*` line of a step comes after its checkpoint decision: the
    tee stops at the first train line, at or after the breach, of a checkpointed step (here
    step 6 with save_period 3: the breach at step 5 waits one step). NeMo RL's `Logger` is
    replaced by a recorder; the monitor, the tee and the stop are the engine's own."""
    from nemo_fp8_rl.engines.nemo.driver.metrics_log import BreachStop, MetricsTee, health_monitor

    cfg = load_recipe(FP8, [*BREACH[-1:], "health.on_breach=stop"]).config
    cfg["checkpointing"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    logged = []

    class Recorder:  # NeMo RL's Logger needs its backends; only its calls are recorded here
        def log_metrics(self, metrics, step, prefix="", *args, **kwargs):
            logged.append((step, prefix))

    jsonl = tmp_path / "metrics.jsonl"
    stop = BreachStop(cfg, "run", "nemo_fp8_rl.train --recipe R --engine nemo --resume")
    tee = MetricsTee(Recorder(), jsonl, health_monitor(cfg, jsonl), stop)
    row = {"token_mult_prob_error": 1.01, "gen_kl_error": 0.001}
    for step in range(1, 6):  # NeMo RL's last call of a step says step_finished
        tee.log_metrics(row, step, "train", step_finished=True)
    assert stop.pending is not None and stop.pending.step == 5  # breached, not yet saved
    (tmp_path / "checkpoints" / "step_6").mkdir(parents=True)
    with pytest.raises(HealthBreach) as caught:
        tee.log_metrics(row, 6, "train", step_finished=True)
    assert "the checkpoint" in str(caught.value) and "step_6" in str(caught.value)
    assert "--engine nemo --resume" in str(caught.value) and logged[-1] == (6, "train")
    assert "health: step 5" in capsys.readouterr().out
