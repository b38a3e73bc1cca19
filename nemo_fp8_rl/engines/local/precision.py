"""Precision of the embedded engine's two models, read from the recipe's NeMo RL keys.

Training (`policy.megatron_cfg.fp8_cfg`): FP32 master weights (AdamW state FP32) with BF16
compute emulated by rounding weights, inputs and outputs of every decoder Linear to BF16; with
`enabled: true`, W8A8 fake quantization as Transformer Engine does it:
- `fp8_recipe: blockwise` (`Float8BlockScaling`): weights 128x128 tiles, activations and
  gradients 1x128 groups; FP32 scales when `NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1` (the project's
  FP8 overlay sets it), else power-of-2 scales (TE's default);
- `fp8_recipe: tensorwise` (`Float8CurrentScaling`): one scale per tensor;
- `fp8: e4m3` quantizes gradients to E4M3 too, `fp8: hybrid` to E5M2.
The BF16 shadow pass is the same model with FP8 off (`fp8_emulation(model, enabled=False)`).

Rollout (`policy.generation.vllm_cfg`): `precision: fp8` gives W8A8 with the weights the refit
plan produced (same scheme and scale kind) and dynamic activation scales (1x128 groups for block
scaling, per tensor otherwise; power-of-2 with `pow2_activation_scaling_factors`); layers the plan
keeps in BF16 stay BF16. `kv_cache_dtype: fp8` adds E4M3 K/V with per-layer scales that the
trainer calibrates on each step's batch (as NeMo RL does) and sends with the refit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nemo_fp8_rl.engines.local.recipe_checks import check_cpu_support as check_cpu_support
from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.fp8.emulation import (
    FP8EmulatedLinear,
    calibrate_kv_scales,
    convert_to_fp8_emulation,
    enable_fp8_kv_cache_emulation,
    fp8_emulation,
)
from nemo_fp8_rl.fp8.kv_cache import kv_states
from nemo_fp8_rl.refit import RefitPlan


def _train_specs(cfg: dict[str, Any]) -> tuple[FP8Spec, FP8Spec, FP8Spec]:
    """(weight, activation, gradient) specs of Transformer Engine's recipe in `fp8_cfg`."""
    meg = cfg["policy"]["megatron_cfg"]
    fp8 = meg["fp8_cfg"]
    env = meg.get("env_vars") or {}
    grad_fmt = "e5m2" if fp8.get("fp8", "e4m3") == "hybrid" else "e4m3"
    if fp8.get("fp8_recipe", "blockwise") == "tensorwise":
        return (
            FP8Spec("e4m3", "tensorwise"),
            FP8Spec("e4m3", "tensorwise"),
            FP8Spec(grad_fmt, "tensorwise"),
        )
    scale = "fp32" if str(env.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0")) == "1" else "pow2"
    return (
        FP8Spec("e4m3", "blockwise", scale),
        FP8Spec("e4m3", "rowwise", scale),
        FP8Spec(grad_fmt, "rowwise", scale),
    )


@dataclass(frozen=True)
class TrainingPrecision:
    """How the trainer's model computes (see the module docstring)."""

    fp8: bool
    specs: tuple[FP8Spec, FP8Spec, FP8Spec] | None
    kv_fp8: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> TrainingPrecision:
        """Read `policy.megatron_cfg.fp8_cfg` and `vllm_cfg.kv_cache_dtype`."""
        enabled = bool(cfg["policy"]["megatron_cfg"]["fp8_cfg"].get("enabled"))
        kv = cfg["policy"]["generation"]["vllm_cfg"].get("kv_cache_dtype") == "fp8"
        return cls(fp8=enabled, specs=_train_specs(cfg) if enabled else None, kv_fp8=kv)

    def apply(self, model: nn.Module) -> None:
        """Convert the decoder Linears in place (BF16 rounding always; FP8 when enabled)."""
        w, a, g = self.specs or (FP8Spec(), FP8Spec("e4m3", "rowwise"), None)
        convert_to_fp8_emulation(model, weight_spec=w, act_spec=a, grad_spec=g, bf16=True)
        if not self.fp8:
            for mod in model.modules():
                if isinstance(mod, FP8EmulatedLinear):
                    mod.fp8_enabled = False
        if self.kv_fp8:  # K/V amax bookkeeping only: training attention stays BF16
            enable_fp8_kv_cache_emulation(model)
            for state in kv_states(model):
                state.fp8_enabled = False

    def shadow(self, model: nn.Module):
        """Context for the BF16 shadow pass (FP8 off, BF16 rounding kept)."""
        return fp8_emulation(model, enabled=False) if self.fp8 else nullcontext(model)

    @contextmanager
    def kv_calibration(self, model: nn.Module) -> Iterator[None]:
        """Record K/V amax of the forwards inside the block (a no-op without FP8 KV cache)."""
        if not self.kv_fp8:
            yield
            return
        with calibrate_kv_scales(model):
            yield
        for state in kv_states(model):
            state.fp8_enabled = False


def kv_scales(model: nn.Module) -> list[tuple[float, float]]:
    """The per-layer (k_scale, v_scale) of a model with FP8 KV emulation (empty otherwise)."""
    return [(s.k_scale, s.v_scale) for s in kv_states(model)]


def export_weights(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """HF-named parameters as BF16 (what the trainer sends); a tied LM head is sent once."""
    seen, out = set(), []
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p.detach().to(torch.bfloat16)))
    return out


@dataclass(frozen=True)
class RolloutPrecision:
    """How the generation engine's model computes (see the module docstring)."""

    plan: RefitPlan
    act_spec: FP8Spec | None
    kv_fp8: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any], model: nn.Module) -> RolloutPrecision:
        """The refit plan for `model`'s parameters and the activation / KV settings."""
        vllm = cfg["policy"]["generation"]["vllm_cfg"]
        names = [n for n, _ in export_weights(model)]
        plan = RefitPlan.from_config(cfg, names, target="module")
        act = None
        if plan.spec is not None:
            gran = "rowwise" if plan.scheme == "block" else "tensorwise"
            scale = "pow2" if vllm.get("pow2_activation_scaling_factors") else "fp32"
            act = FP8Spec("e4m3", gran, scale)
        return cls(plan=plan, act_spec=act, kv_fp8=vllm.get("kv_cache_dtype") == "fp8")

    def apply(self, model: nn.Module) -> None:
        """Convert in place: FP8 W8A8 for the plan's FP8 weights, BF16 rounding elsewhere."""
        fp8_names = self.plan.fp8_names
        convert_to_fp8_emulation(
            model,
            weight_spec=self.plan.spec or FP8Spec(),
            act_spec=self.act_spec or FP8Spec("e4m3", "rowwise"),
            bf16=True,
        )
        for fqn, mod in model.named_modules():
            if isinstance(mod, FP8EmulatedLinear):
                mod.fp8_enabled = self.act_spec is not None and f"{fqn}.weight" in fp8_names
        if self.kv_fp8:
            enable_fp8_kv_cache_emulation(model)


def set_kv_scales(model: nn.Module, scales: list[tuple[float, float]]) -> None:
    """Install the trainer's per-layer K/V scales in the rollout model's FP8 KV cache."""
    states = list(kv_states(model))
    if len(states) != len(scales):
        raise ValueError(f"got K/V scales for {len(scales)} layers, the model has {len(states)}")
    for state, (k, v) in zip(states, scales, strict=True):
        state.k_scale, state.v_scale = k, v
