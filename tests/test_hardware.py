"""GPU precision checks: MXFP8 only on Blackwell, FP32 block scales only on Hopper, FP8 from 8.9."""

from __future__ import annotations

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.hardware import gpu_precision_issues
from nemo_fp8_rl.engines.nemo.driver.runner import check_recipe

H100, B200, A100 = (9, 0), (10, 0), (8, 0)
BASE = "paper-fp8-rl/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-8k-bf16"
MXFP8 = [
    "policy.megatron_cfg.fp8_cfg.enabled=true",
    "policy.megatron_cfg.fp8_cfg.fp8_recipe=mxfp8",
    "policy.generation.vllm_cfg.precision=fp8",
    "policy.generation.vllm_cfg.is_mx=true",
    "policy.generation.vllm_cfg.pow2_weight_scaling_factors=true",
    "policy.generation.vllm_cfg.pow2_activation_scaling_factors=true",
]


def _keys(cfg, cap):
    return sorted(i.key for i in gpu_precision_issues(cfg, cap, f"test GPU {cap}"))


def test_mxfp8_is_refused_on_hopper_and_runs_on_blackwell():
    cfg = load_recipe(BASE, MXFP8).config
    assert _keys(cfg, H100) == [
        "policy.generation.vllm_cfg.is_mx",
        "policy.megatron_cfg.fp8_cfg.fp8_recipe",
    ]
    (issue, _) = gpu_precision_issues(cfg, H100, "NVIDIA H100 (9.0)")
    assert "needs a Blackwell GPU" in issue.what and "NVIDIA H100 (9.0)" in issue.what
    assert _keys(cfg, B200) == []


def test_fp32_block_scales_are_refused_on_blackwell_only():
    cfg = load_recipe(BASE.replace("-bf16", "-fp8-blockwise")).config
    assert _keys(cfg, H100) == []
    assert _keys(cfg, B200) == ["policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES"]
    tensorwise = load_recipe(BASE.replace("-bf16", "-fp8-tensorwise")).config
    assert _keys(tensorwise, B200) == [] and _keys(tensorwise, H100) == []


def test_fp8_needs_ada_or_newer_and_bf16_runs_anywhere():
    assert _keys(load_recipe(BASE.replace("-bf16", "-fp8-tensorwise")).config, A100) == [
        "policy.megatron_cfg.fp8_cfg.enabled"
    ]
    assert _keys(load_recipe(BASE).config, A100) == []


def test_engine_check_uses_the_workers_gpu_never_the_local_one(monkeypatch):
    """The NeMo RL engine's pre-start check decides for the workers' GPU type (`slurm.gpu`,
    `--gpu`, the partition), not for this machine's: a Hopper driver refuses nothing for
    Blackwell workers, and a GPU-less or Blackwell driver does not pass Hopper workers."""
    import nemo_fp8_rl.config.hardware as hw

    monkeypatch.setattr(hw, "local_gpu", lambda: (H100, "NVIDIA H100 80GB HBM3 (9.0)"))
    assert check_recipe(load_recipe(BASE, [*MXFP8, "slurm.gpu=B200"])) == []
    monkeypatch.setattr(hw, "local_gpu", lambda: (B200, "NVIDIA B200 (10.0)"))
    problems = check_recipe(load_recipe(BASE, [*MXFP8, "slurm.gpu=H100"]))
    assert any("MXFP8 training (E8M0 scales) needs Blackwell" in p for p in problems), problems
    monkeypatch.setattr(hw, "local_gpu", lambda: None)  # a CPU driver node
    assert check_recipe(load_recipe(BASE, MXFP8)) == []  # workers' GPU not named: not decided


@pytest.mark.gpu
def test_local_gpu_reports_capability():
    import torch

    from nemo_fp8_rl.config.hardware import local_gpu

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (scripts/gpu_check.sh)")
    cap, name = local_gpu()
    assert cap >= (7, 0) and name.endswith(f"({cap[0]}.{cap[1]})")
