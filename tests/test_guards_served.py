"""FP8 active at run time (docs/guard-rails.md, served-precision): the generation side counts
its linear layers per precision at step 0 and after every refit, on both engines, and a recipe
whose FP8 layers come up BF16 (or whose patches are missing) stops with a located error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nemo_fp8_rl.guards.served import (
    BAD_SCALE,
    BF16,
    FP8_BLOCK,
    MXFP8,
    ServedCounts,
    ServedPrecisionError,
    check_served,
    classify,
    kept_bf16,
)

FP8_VLLM = {"precision": "fp8", "num_first_layers_in_bf16": 0, "num_last_layers_in_bf16": 0}


def layer(
    out: int,
    inp: int,
    dtype: torch.dtype,
    scale: torch.Tensor | None,
    name: str = "weight_scale_inv",
) -> nn.Module:
    m = nn.Module()
    m.weight = nn.Parameter(torch.zeros(out, inp, dtype=dtype), requires_grad=False)
    if scale is not None:
        setattr(m, name, nn.Parameter(scale, requires_grad=False))
    return m


def test_layers_are_classified_by_weight_and_scale():
    e4m3 = torch.float8_e4m3fn
    assert (
        classify(layer(192, 320, e4m3, torch.ones(2, 3))) == FP8_BLOCK
    )  # ceil(192/128), ceil(320/128)
    assert classify(layer(192, 320, e4m3, torch.ones(4, 3))) == FP8_BLOCK  # DeepGEMM's padded rows
    assert classify(layer(192, 320, e4m3, torch.ones(2, 2))) == BAD_SCALE
    assert classify(layer(192, 320, e4m3, torch.ones(2, 3, dtype=torch.bfloat16))) == BAD_SCALE
    assert (
        classify(layer(192, 320, e4m3, torch.ones(192, 10, dtype=torch.uint8), "weight_scale"))
        == MXFP8
    )
    assert classify(layer(192, 320, torch.bfloat16, None)) == BF16


def test_the_layers_a_recipe_keeps_bf16():
    cfg = {
        **FP8_VLLM,
        "num_first_layers_in_bf16": 1,
        "num_last_layers_in_bf16": 1,
        "quantization_ignored_layer_kws": ["a_proj"],
    }
    assert kept_bf16("model.layers.0.mlp.down_proj", cfg, 4) == "num_first_layers_in_bf16"
    assert kept_bf16("model.layers.3.mlp.down_proj", cfg, 4) == "num_last_layers_in_bf16"
    assert kept_bf16("model.layers.1.self_attn.kv_a_proj_with_mqa", cfg, 4).startswith(
        "quantization"
    )
    assert kept_bf16("model.layers.1.mlp.gate", cfg, 4).startswith("MoE router")
    assert kept_bf16("model.layers.1.mlp.gate_proj", cfg, 4) is None


def test_a_fused_vllm_layer_is_kept_bf16_when_every_part_it_loads_is_ignored():
    """NeMo RL matches quantization_ignored_layer_kws against Hugging Face names (q_proj, k_proj,
    v_proj); vLLM serves their fused qkv_proj in BF16 when all its parts are ignored."""
    qkv = {"quantization_ignored_layer_kws": ["self_attn.q_proj", "self_attn.k_proj",
                                              "self_attn.v_proj"]}  # fmt: skip
    why = kept_bf16("model.layers.0.self_attn.qkv_proj", qkv, 2)
    assert why is not None and "qkv_proj" in why and "'self_attn.v_proj'" in why
    assert kept_bf16("model.layers.0.mlp.gate_up_proj", qkv, 2) is None
    partial = {"quantization_ignored_layer_kws": ["self_attn.q_proj"]}
    assert kept_bf16("model.layers.0.self_attn.qkv_proj", partial, 2) is None
    mlp = {"quantization_ignored_layer_kws": ["mlp"]}
    assert (
        kept_bf16("model.layers.0.mlp.gate_up_proj", mlp, 2)
        == "quantization_ignored_layer_kws 'mlp'"
    )


def test_fp8_layers_served_bf16_stop_the_run_naming_them():
    served = ServedCounts(
        {"model.layers.0.mlp.down_proj": FP8_BLOCK, "model.layers.1.mlp.down_proj": BF16},
        True,
        "w",
        2,
    )
    with pytest.raises(ServedPrecisionError) as info:
        check_served([served], FP8_VLLM, "after refit 3")
    text = str(info.value)
    assert "policy.generation.vllm_cfg.precision (after refit 3)" in text
    assert "model.layers.1.mlp.down_proj: served bf16, expected fp8-block" in text
    assert "[served-precision, NVIDIA-NeMo/RL#3755]" in text and "Fix:" in text
    assert check_served([served], {**FP8_VLLM, "num_last_layers_in_bf16": 1}, "step 0")
    unpatched = ServedCounts(
        {"model.layers.0.mlp.down_proj": FP8_BLOCK}, False, "vLLM worker rank 1", 1
    )
    with pytest.raises(ServedPrecisionError, match="patches are not in place"):
        check_served([unpatched], FP8_VLLM, "step 0")
    assert ServedCounts.from_dict(unpatched.to_dict()) == unpatched  # crosses Ray as a dict


# ---- the embedded engine ------------------------------------------------------------------
SMALL = [
    "grpo.num_prompts_per_step=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "local.warmup.steps=5",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=8",
]


def _rollout(name: str, tmp_path, monkeypatch):
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.config.project import LocalConfig
    from nemo_fp8_rl.engines.local.rollout import Rollout
    from nemo_fp8_rl.engines.local.runner import prepare_model
    from nemo_fp8_rl.engines.local.trainer import Trainer

    monkeypatch.setenv("NEMO_FP8_RL_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(f"tiny/{name}", SMALL, run_dir=tmp_path)
    prepare_model(recipe, tmp_path, LocalConfig(**recipe.config["local"]))
    trainer = Trainer(recipe.config, str(tmp_path / "model"))
    rollout = Rollout(recipe.config, str(tmp_path / "model"))
    rollout.apply_refit(trainer.refit_buckets())
    return recipe.config, rollout


def test_embedded_rollout_serves_what_the_recipe_says(tmp_path, monkeypatch):
    cfg, rollout = _rollout("grpo-tiny-qwen3-cpu-fp8", tmp_path, monkeypatch)
    served = ServedCounts.from_dict(rollout.served_precision())
    assert served.counts() == {FP8_BLOCK: 14}  # 2 layers x (q, k, v, o, gate, up, down)
    (line,) = check_served([served], cfg["policy"]["generation"]["vllm_cfg"], "step 0")
    assert line == "embedded rollout engine: 14 fp8-block"


def test_embedded_rollout_with_its_fp8_switch_broken_is_refused(tmp_path, monkeypatch):
    """Break what makes the rollout's layers FP8 (`RolloutPrecision.apply`, the embedded
    engine's counterpart of NeMo RL's vLLM patches): every FP8 layer comes up BF16."""
    from nemo_fp8_rl.engines.local import precision

    original = precision.RolloutPrecision.apply

    def broken(self, model):
        original(self, model)
        for module in model.modules():
            if hasattr(module, "fp8_enabled"):
                module.fp8_enabled = False

    monkeypatch.setattr(precision.RolloutPrecision, "apply", broken)
    cfg, rollout = _rollout("grpo-tiny-qwen3-cpu-fp8", tmp_path, monkeypatch)
    served = ServedCounts.from_dict(rollout.served_precision())
    with pytest.raises(ServedPrecisionError) as info:
        check_served([served], cfg["policy"]["generation"]["vllm_cfg"], "step 0")
    assert len(info.value.problems) == 14
    assert "model.layers.0.self_attn.q_proj: served bf16, expected fp8-block" in str(info.value)


def test_an_mxfp8_layer_as_the_cpu_generation_worker_serves_it_is_mxfp8():
    """NeMo RL's MXFP8 path loads the E8M0 bytes as `weight_scale_from_checkpoint` (the CPU
    generation worker holds only that name): counted MXFP8, not a bad scale."""
    from nemo_fp8_rl.engines.nemo.cpu.served_model import ServedLinear
    from nemo_fp8_rl.fp8 import FP8Spec

    served = ServedLinear(torch.nn.Linear(64, 32), True, FP8Spec.preset("mxfp8"), mx=True)
    assert not hasattr(served, "weight_scale") and classify(served) == MXFP8
    e4m3 = torch.float8_e4m3fn
    short = layer(
        192, 320, e4m3, torch.ones(192, 9, dtype=torch.uint8), "weight_scale_from_checkpoint"
    )
    assert classify(short) == BAD_SCALE  # 9 bytes per row where 320 / 32 = 10 are needed


def test_scales_an_all_zero_block_left_bad_are_a_bad_scale():
    """After a refit the served check reads the scales' values: an inf/NaN/zero block scale or
    an E8M0 NaN byte (255) is what an all-zero block gives a quantizer without its own case."""
    e4m3 = torch.float8_e4m3fn
    for bad in (float("inf"), float("nan"), 0.0):
        scale = torch.ones(2, 3)
        scale[1, 2] = bad
        assert classify(layer(192, 320, e4m3, scale)) == BAD_SCALE, bad
    nan_byte = torch.full((192, 10), 127, dtype=torch.uint8)
    nan_byte[5, 3] = 255
    assert classify(layer(192, 320, e4m3, nan_byte, "weight_scale")) == BAD_SCALE
