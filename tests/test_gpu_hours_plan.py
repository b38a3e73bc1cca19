"""scripts/gpu_hours.py --plan: nodes, trajectory age, the cited FP8 / BF16 step-time ratio and
the refit bytes of a recipe, from the recipe and the shipped config.json."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config
from nemo_fp8_rl.refit.wire_bytes import wire_bytes

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_hours", ROOT / "scripts/gpu_hours.py")
gpu_hours = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_hours)


def test_plan_of_the_async_deepseek_recipe():
    cfg = load_recipe("deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8").config
    row = gpu_hours.plan_row(cfg)
    assert row["nodes"] == "64x8 (32 train + 32 generate)" and row["async"] == "1-off"
    low, high, source = row["ratio"]
    assert (low, high) == (0.75, 0.85) and "extrapolation" in source
    assert 0.5 < row["trainer_over_generator"] < 0.51  # MoE experts dominate: near E4M3's half
    assert row["refit_gib"] > 1200  # NeMo RL's default refit sends BF16: 671e9 x 2 bytes


def test_plan_names_the_measured_case_and_the_fp8_kv_cache_figure():
    llama = load_recipe("llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8").config
    assert "extrapolation" not in gpu_hours.step_ratio(llama)[2]
    kv = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache").config
    assert gpu_hours.step_ratio(kv)[:2] == (1 / 1.48, 1 / 1.48)
    assert (
        gpu_hours.step_ratio(load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16").config)
        is None
    )


def test_trainer_side_refit_counts_fp8_pairs():
    name = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8"
    cfg = load_recipe(name, ["refit.quantize_on=trainer"]).config
    trainer, generator, fp8_only = wire_bytes(model_config(cfg["policy"]["model_name"]))
    assert gpu_hours.plan_row(cfg)["refit_gib"] == trainer / 2**30 and trainer < generator
    assert gpu_hours.plan_row(load_recipe(name).config)["refit_gib"] == generator / 2**30
    assert 0.5 < fp8_only < 0.51  # E4M3 bytes plus one FP32 scale per 128 x 128 block
