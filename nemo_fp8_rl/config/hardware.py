"""Precision settings a GPU cannot run, checked once the engine knows the GPU.

The recipe rules (`rules.py`) know only the config; these need the device's CUDA compute
capability `(major, minor)` (`torch.cuda.get_device_capability()`): 9.x is Hopper, 10.x and 12.x
are the Blackwell families, 8.9 is Ada. Facts (Transformer Engine, vLLM, NeMo RL):

- MXFP8 (Megatron `fp8_recipe: mxfp8`, TE `MXFP8BlockScaling`; vLLM `is_mx`) runs on Blackwell only;
- TE's FP32 block scales (`NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`) are Hopper-only: on Blackwell
  block scaling is carried out with MXFP8 kernels, which need power-of-2 scales;
- FP8 tensor cores start at compute capability 8.9.
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup

Capability = tuple[int, int]
_VLLM = "policy.generation.vllm_cfg"
_FP8 = "policy.megatron_cfg.fp8_cfg"


def _get(config: dict, key: str) -> Any:
    value = lookup(config, key)
    return None if is_missing(value) else value


def _blackwell(cap: Capability) -> bool:
    return cap[0] in (10, 12)


def gpu_precision_issues(config: dict, capability: Capability, where: str) -> list[Problem]:
    """Every precision setting of `config` the GPU with `capability` cannot run (empty: fine).

    `where` names the device in the messages (e.g. "NVIDIA H100 80GB HBM3 (9.0)").
    """
    out = []
    fp8_train = bool(_get(config, f"{_FP8}.enabled"))
    fp8_rollout = _get(config, f"{_VLLM}.precision") == "fp8"
    if (fp8_train or fp8_rollout) and capability < (8, 9):
        key = f"{_FP8}.enabled" if fp8_train else f"{_VLLM}.precision"
        out.append(
            Problem(
                key,
                f"FP8 needs compute capability 8.9 or newer; this GPU is {where}",
                "use a BF16 recipe on this GPU, or run on Hopper or Blackwell",
                "GPU check",
            )
        )
    if fp8_train and _get(config, f"{_FP8}.fp8_recipe") == "mxfp8" and not _blackwell(capability):
        out.append(
            Problem(
                f"{_FP8}.fp8_recipe",
                f"MXFP8 training needs a Blackwell GPU (compute capability 10.x/12.x); this GPU is {where}",
                "use configs/precision/fp8-blockwise.yaml or fp8-tensorwise.yaml on this GPU",
                "GPU check",
            )
        )
    if fp8_rollout and _get(config, f"{_VLLM}.is_mx") and not _blackwell(capability):
        out.append(
            Problem(
                f"{_VLLM}.is_mx",
                f"MXFP8 rollout needs a Blackwell GPU (compute capability 10.x/12.x); this GPU is {where}",
                f"set {_VLLM}.is_mx=false (block-scaled FP8 rollout)",
                "GPU check",
            )
        )
    env = _get(config, "policy.megatron_cfg.env_vars") or {}
    fp32_scales = str(env.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0")) == "1"
    if (
        fp8_train
        and _get(config, f"{_FP8}.fp8_recipe") == "blockwise"
        and fp32_scales
        and _blackwell(capability)
    ):
        out.append(
            Problem(
                "policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
                f"FP32 block scales are Hopper-only; on Blackwell ({where}) block scaling runs on "
                "MXFP8 kernels, which need power-of-2 scales",
                'remove NVTE_FP8_BLOCK_SCALING_FP32_SCALES (or set it to "0")',
                "GPU check",
            )
        )
    return out


def local_gpu() -> tuple[Capability, str] | None:
    """`(capability, description)` of CUDA device 0, or None without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    cap = tuple(torch.cuda.get_device_capability(0))
    return (cap[0], cap[1]), f"{torch.cuda.get_device_name(0)} ({cap[0]}.{cap[1]})"
