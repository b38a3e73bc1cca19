"""End to end: a few GRPO steps of the tiny BF16 and FP8 recipes through Ray, with metrics,
checkpoints and an exact resume."""

from __future__ import annotations

import json
import math

import pytest
import ray
import torch

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.local import run
from nemo_fp8_rl.engines.local.checkpoint import latest_checkpoint
from nemo_fp8_rl.engines.local.metrics import read_metrics

FAST = [
    "grpo.num_prompts_per_step=8",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "local.warmup.steps=30",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=32",
    "loss_fn.calibration.interval=2",
    "loss_fn.calibration.min_tokens=4",
]


@pytest.fixture(scope="module", autouse=True)
def ray_session(tmp_path_factory):
    """One local Ray for the module; the warm-up cache in a temporary directory."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NEMO_FP8_RL_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield
    ray.shutdown()
    mp.undo()


def _run(name: str, run_dir, steps: int, resume: bool = False):
    recipe = load_recipe(f"tiny/{name}", [*FAST, f"grpo.max_num_steps={steps}"], run_dir=run_dir)
    return run(recipe, resume=resume, progress=False)


def _train_values(records: list[dict]) -> dict[int, dict[str, float]]:
    """Per step, every metric except timings, throughput and load (which depend on the machine)."""
    return {
        r["step"]: {
            k: v
            for k, v in r.items()
            if not k.startswith(("timing/", "throughput/", "system/", "step"))
        }
        for r in records
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo-tiny-qwen3-cpu-bf16", "grpo-tiny-qwen3-cpu-fp8"])
def test_steps_checkpoint_and_exact_resume(name, tmp_path):
    torch.set_num_threads(1)
    full = _run(name, tmp_path / "full", steps=4)
    records = read_metrics(full)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert "validation/accuracy" in records[0]
    for r in records[1:]:
        for key in (
            "train/reward",
            "train/loss",
            "train/entropy",
            "train/token_mult_prob_error",
            "train/gen_kl_error",
            "train/clip_lower_frac_neg",
            "train/clip_upper_frac_pos",
            "train/calib_low",
            "train/calib_high",
            "timing/train/generate",
            "timing/train/logprobs",
            "timing/train/policy_training",
            "timing/train/refit",
            "timing/train/shadow",
            "timing/train/total_step_time",
            "throughput/tokens_per_sec",
        ):
            assert key in r and r[key] is not None and math.isfinite(r[key]), (key, r.get(key))
        assert r["train/updates_per_step"] == 4.0
        assert 0.9 < r["train/token_mult_prob_error"] < 1.2
    fp8 = "fp8" in name
    shadow_steps = [r["step"] for r in records if "train/ratio_nmae" in r]
    assert shadow_steps == ([1, 3] if fp8 else [])  # steps 0 and 2 (0-based) in FP8 only
    assert all(r["timing/train/shadow"] > 0 for r in records[1:] if r["step"] in shadow_steps)
    assert ("validation/accuracy" in records[2]) and ("validation/accuracy" in records[4])
    for r in (records[0], records[2], records[4]):  # every validation has its BF16 score too
        assert 0.0 <= r["validation/bf16_accuracy"] <= 1.0
        if not fp8:  # a BF16 rollout engine's score is the BF16 score
            assert r["validation/bf16_accuracy"] == r["validation/accuracy"]
    assert (full / "recipe.yaml").exists() and (full / "model" / "config.json").exists()
    env = json.loads((full / "environment.json").read_text())
    assert env["engine"] == "local" and env["versions"]["torch"]
    assert env["generator"]["backend"] == "embedded"  # what served the rollouts (compare reads it)
    assert list((full / "logs" / "tb").glob("events.out.tfevents.*"))
    assert latest_checkpoint(full / "checkpoints").name == "step_4"

    part = _run(name, tmp_path / "part", steps=2)
    assert latest_checkpoint(part / "checkpoints").name == "step_2"
    _run(name, part, steps=4, resume=True)
    resumed = read_metrics(part)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert _train_values(resumed) == _train_values(records)
