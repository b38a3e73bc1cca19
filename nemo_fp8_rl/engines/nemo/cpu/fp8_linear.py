"""FP8 (and BF16) compute for the CPU policy worker's megatron-core linear layers, emulated.

megatron-core with `fp8="e4m3"` and no Transformer Engine silently computes in the parameters'
precision (measured: identical loss), so FP8 on the CPU is the project's quantize-dequantize
emulation (`fp8.emulation.FP8EmulatedLinear`): every `ColumnParallelLinear` /
`RowParallelLinear` inside the decoder layers (QKV, attention output, MLP fc1/fc2; not the
embedding or the LM head, which Transformer Engine keeps in BF16 too) computes through an
emulated layer that shares its weight parameter. Each call reads the layer's own
`TransformerConfig.fp8`: set, W8A8 with the recipe's scaling; `None`, the BF16 path (inputs,
weights and outputs rounded to BF16 when `policy.precision` is bfloat16). So the project's
`Fp8ComputeSwitch`, which sets `fp8 = None` on every config and restores it, flips this worker
exactly as it flips Transformer Engine's autocast on a GPU worker.

Scaling (`policy.megatron_cfg.fp8_cfg`, as Transformer Engine's recipes quantize):
`fp8_recipe: blockwise` weights 128x128 tiles, activations and gradients 1x128 groups, FP32
scales with `NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1` in `megatron_cfg.env_vars` else power-of-2;
`tensorwise` one scale per tensor; `mxfp8` Transformer Engine's `MXFP8BlockScaling`: E4M3 in
1x32 blocks with E8M0 scales for weights, activations and gradients (the weight quantized along
its output dim for the input gradient, as TE's columnwise copy; `fp8.emulation`); `fp8: hybrid`
sends gradients as E5M2, `e4m3` as E4M3.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.fp8.emulation import FP8EmulatedLinear

RECIPES = ("blockwise", "tensorwise", "mxfp8")


def fp8_specs(policy_cfg: dict[str, Any]) -> tuple[FP8Spec, FP8Spec, FP8Spec]:
    """(weight, activation, gradient) specs for the policy's `megatron_cfg.fp8_cfg`."""
    meg = policy_cfg["megatron_cfg"]
    fp8 = meg.get("fp8_cfg") or {}
    recipe = fp8.get("fp8_recipe", "blockwise")
    if recipe not in RECIPES:
        raise UsageError(
            f"policy.megatron_cfg.fp8_cfg.fp8_recipe={recipe!r}",
            "not emulated by the CPU policy worker",
            f"use one of {list(RECIPES)}",
        )
    grad_fmt = "e5m2" if fp8.get("fp8", "e4m3") == "hybrid" else "e4m3"
    if recipe == "mxfp8":
        mx = FP8Spec.preset("mxfp8")
        return mx, mx, FP8Spec(grad_fmt, "mxfp8", "e8m0")
    if recipe == "tensorwise":
        spec = FP8Spec("e4m3", "tensorwise")
        return spec, spec, FP8Spec(grad_fmt, "tensorwise")
    env = meg.get("env_vars") or {}
    scale = "fp32" if str(env.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0")) == "1" else "pow2"
    return (
        FP8Spec("e4m3", "blockwise", scale),
        FP8Spec("e4m3", "rowwise", scale),
        FP8Spec(grad_fmt, "rowwise", scale),
    )


def _decoder_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and ".layers." in f".{name}"
    ]


def _emulated_forward_impl(self: Any, input: torch.Tensor, weight: torch.Tensor, *args, **kwargs):
    """`_forward_impl` of a converted layer: the emulated linear, FP8 while `config.fp8`."""
    emu: FP8EmulatedLinear = self.__dict__["_cpu_emulated"]
    if weight is not self.weight:
        raise RuntimeError(f"{type(self).__name__}: an external weight is not emulated")
    emu.fp8_enabled = bool(self.config.fp8)
    out = emu(input)
    bias = kwargs.get("bias", args[0] if args else None)
    return out if bias is None else out + bias


def install(model: torch.nn.Module, policy_cfg: dict[str, Any], bf16: bool) -> int:
    """Route every decoder linear of `model` through the emulation; returns how many.

    The emulated layer is held outside the module tree (no new parameters or state-dict keys).
    """
    fp8_on = bool((policy_cfg["megatron_cfg"].get("fp8_cfg") or {}).get("enabled"))
    w, a, g = fp8_specs(policy_cfg) if fp8_on else (FP8Spec(), FP8Spec("e4m3", "rowwise"), None)
    layers = _decoder_linears(model)
    for _, layer in layers:
        shell = types.SimpleNamespace(
            in_features=layer.weight.shape[1],
            out_features=layer.weight.shape[0],
            weight=layer.weight,
            bias=None,
        )
        emu = FP8EmulatedLinear.from_linear(
            shell, weight_spec=w, act_spec=a, grad_spec=g, bf16=bf16
        )
        layer.__dict__["_cpu_emulated"] = emu
        layer._forward_impl = types.MethodType(_emulated_forward_impl, layer)
    return len(layers)


def set_fp8_config(model: torch.nn.Module, policy_cfg: dict[str, Any]) -> None:
    """Put `fp8_cfg`'s `fp8` / `fp8_recipe` / `fp8_param` on the model's `TransformerConfig`s
    (after construction: megatron-core refuses `fp8` at construction without Transformer Engine)."""
    from nemo_fp8_rl.engines.nemo.worker.fp8_switch import transformer_configs

    fp8 = policy_cfg["megatron_cfg"].get("fp8_cfg") or {}
    for cfg in transformer_configs(model):
        if fp8.get("enabled"):
            cfg.fp8 = fp8.get("fp8", "e4m3")
            cfg.fp8_recipe = fp8.get("fp8_recipe", "blockwise")
            cfg.fp8_param = bool(fp8.get("fp8_param", False))
        else:
            cfg.fp8 = None
