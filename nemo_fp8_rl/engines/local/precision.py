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

MXFP8 (Blackwell's format; `fp8_recipe: mxfp8`, `vllm_cfg.is_mx: true`): E4M3 in 1x32 blocks
with E8M0 scales for weights, activations and gradients (TE `MXFP8BlockScaling`); the rollout
receives BF16 weights and quantizes them itself, as NeMo RL's receiver does for `is_mx`.

4-bit formats (`local.fp4: nvfp4 | mxfp4`, this engine only): W4A4 on both sides, fake-quantized
with a straight-through backward (quantization-aware training, as NeMo RL's NVFP4 path through
ModelOpt): NVFP4 weights in TE's 16x16 tiles for training and vLLM's 1x16 for the rollout,
activations 1x16; MXFP4 1x32 everywhere. The rollout quantizes the BF16 refit on receipt.
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
    QuantSpec,
    calibrate_kv_scales,
    convert_to_fp8_emulation,
    enable_fp8_kv_cache_emulation,
    fp8_emulation,
)
from nemo_fp8_rl.fp8.fp4 import FP4Spec
from nemo_fp8_rl.fp8.kv_cache import kv_states
from nemo_fp8_rl.refit import RefitPlan
from nemo_fp8_rl.refit.names import layer_index
from nemo_fp8_rl.refit.plan import select_quantized

Specs = tuple[QuantSpec, QuantSpec, QuantSpec | None]


def fp4_kind(cfg: dict[str, Any]) -> str | None:
    """The 4-bit format the recipe emulates (`local.fp4`), or None."""
    return (cfg.get("local") or {}).get("fp4")


def receiver_quantizes(cfg: dict[str, Any]) -> bool:
    """True when the rollout quantizes the BF16 refit itself (MXFP8 `is_mx`, 4-bit formats)."""
    vllm = cfg["policy"]["generation"]["vllm_cfg"]
    return bool(fp4_kind(cfg) or vllm.get("is_mx"))


def refit_scheme(cfg: dict[str, Any]) -> str | None:
    """The refit plan's scheme: "bf16" when the receiver quantizes, else the recipe's (None)."""
    return "bf16" if receiver_quantizes(cfg) else None


def _fp4_specs(cfg: dict[str, Any], *, train: bool) -> Specs:
    """(weight, activation, None): W4A4 with straight-through gradients (module doc), with the
    recipe's NVFP4 variants (`local.fp4_activation_scale`, `local.fp4_four_over_six`)."""
    local = cfg.get("local") or {}
    if local["fp4"] == "mxfp4":
        return FP4Spec("mxfp4", (1, 32)), FP4Spec("mxfp4", (1, 32)), None
    four = bool(local.get("fp4_four_over_six"))
    row = "row" if local.get("fp4_activation_scale", "tensor") == "token" else "tensor"
    weight = FP4Spec("nvfp4", (16, 16) if train else (1, 16), four_over_six=four)
    return weight, FP4Spec("nvfp4", (1, 16), global_scale=row, four_over_six=four), None


def bf16_layers(cfg: dict[str, Any], num_layers: int) -> set[int]:
    """Decoder layers the trainer keeps in BF16: Megatron-Core's `first_last_layers_bf16` with
    `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16` (each 1 when unset, as in
    Megatron-Core's TransformerConfig), given as NeMo RL passes them, in
    `policy.megatron_cfg.model_overrides`."""
    over = cfg["policy"]["megatron_cfg"].get("model_overrides") or {}
    if not over.get("first_last_layers_bf16"):
        return set()
    start = int(over.get("num_layers_at_start_in_bf16", 1))
    end = int(over.get("num_layers_at_end_in_bf16", 1))
    return set(range(min(start, num_layers))) | set(range(max(num_layers - end, 0), num_layers))


def _train_specs(cfg: dict[str, Any]) -> Specs:
    """(weight, activation, gradient) specs of Transformer Engine's recipe in `fp8_cfg`."""
    meg = cfg["policy"]["megatron_cfg"]
    fp8 = meg["fp8_cfg"]
    env = meg.get("env_vars") or {}
    grad_fmt = "e5m2" if fp8.get("fp8", "e4m3") == "hybrid" else "e4m3"
    if fp8.get("fp8_recipe", "blockwise") == "mxfp8":
        mx = FP8Spec.preset("mxfp8")
        return mx, mx, FP8Spec(grad_fmt, "mxfp8", "e8m0")
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
    """How the trainer's model computes (see the module docstring); `quantized`: FP8 or 4-bit
    emulation is on (else BF16)."""

    quantized: bool
    specs: Specs | None
    kv_fp8: bool
    bf16_layers: frozenset[int] = frozenset()

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> TrainingPrecision:
        """Read `policy.megatron_cfg.fp8_cfg` (and `model_overrides`' BF16 layers), `local.fp4`
        and `vllm_cfg.kv_cache_dtype`."""
        kv = cfg["policy"]["generation"]["vllm_cfg"].get("kv_cache_dtype") == "fp8"
        layers = frozenset(bf16_layers(cfg, (cfg.get("local") or {})["model"]["num_layers"]))
        if fp4_kind(cfg):
            specs = _fp4_specs(cfg, train=True)
            return cls(quantized=True, specs=specs, kv_fp8=kv, bf16_layers=layers)
        enabled = bool(cfg["policy"]["megatron_cfg"]["fp8_cfg"].get("enabled"))
        specs = _train_specs(cfg) if enabled else None
        return cls(quantized=enabled, specs=specs, kv_fp8=kv, bf16_layers=layers)

    def apply(self, model: nn.Module) -> None:
        """Convert the decoder Linears in place (BF16 rounding always; FP8 when enabled)."""
        w, a, g = self.specs or (FP8Spec(), FP8Spec("e4m3", "rowwise"), None)
        convert_to_fp8_emulation(model, weight_spec=w, act_spec=a, grad_spec=g, bf16=True)
        for fqn, mod in model.named_modules():
            kept = not self.quantized or layer_index(f"{fqn}.weight") in self.bf16_layers
            if isinstance(mod, FP8EmulatedLinear) and kept:
                mod.fp8_enabled = False
        if self.kv_fp8:  # K/V amax bookkeeping only: training attention stays BF16
            enable_fp8_kv_cache_emulation(model)
            for state in kv_states(model):
                state.fp8_enabled = False

    def shadow(self, model: nn.Module):
        """Context for the BF16 shadow pass (FP8 off, BF16 rounding kept)."""
        return fp8_emulation(model, enabled=False) if self.quantized else nullcontext(model)

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
    """How the generation engine's model computes (see the module docstring): the refit plan
    (what the trainer sends), the specs the served layers quantize with (None: BF16) and which
    weights those layers hold."""

    plan: RefitPlan
    weight_spec: QuantSpec | None
    act_spec: QuantSpec | None
    quantized_names: frozenset[str]
    kv_fp8: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any], model: nn.Module) -> RolloutPrecision:
        """The refit plan for `model`'s parameters and the weight / activation / KV settings."""
        vllm = cfg["policy"]["generation"]["vllm_cfg"]
        names = [n for n, _ in export_weights(model)]
        kv = vllm.get("kv_cache_dtype") == "fp8"
        plan = RefitPlan.from_config(cfg, names, target="module", scheme=refit_scheme(cfg))
        if receiver_quantizes(cfg):
            kind = fp4_kind(cfg)
            w, a, _ = _fp4_specs(cfg, train=False) if kind else (FP8Spec.preset("mxfp8"),) * 3
            chosen, _ = select_quantized(names, vllm)
            return cls(plan, w, a, frozenset(chosen), kv)
        if plan.spec is None:
            return cls(plan, None, None, frozenset(), kv)
        gran = "rowwise" if plan.scheme == "block" else "tensorwise"
        scale = "pow2" if vllm.get("pow2_activation_scaling_factors") else "fp32"
        return cls(plan, plan.spec, FP8Spec("e4m3", gran, scale), plan.fp8_names, kv)

    def apply(self, model: nn.Module) -> None:
        """Convert in place: quantized W?A? for `quantized_names`, BF16 rounding elsewhere."""
        convert_to_fp8_emulation(
            model,
            weight_spec=self.weight_spec or FP8Spec(),
            act_spec=self.act_spec or FP8Spec("e4m3", "rowwise"),
            bf16=True,
        )
        for fqn, mod in model.named_modules():
            if isinstance(mod, FP8EmulatedLinear):
                mod.fp8_enabled = f"{fqn}.weight" in self.quantized_names
        if self.kv_fp8:
            enable_fp8_kv_cache_emulation(model)


def set_kv_scales(model: nn.Module, scales: list[tuple[float, float]]) -> None:
    """Install the trainer's per-layer K/V scales in the rollout model's FP8 KV cache."""
    states = list(kv_states(model))
    if len(states) != len(scales):
        raise ValueError(f"got K/V scales for {len(scales)} layers, the model has {len(states)}")
    for state, (k, v) in zip(states, scales, strict=True):
        state.k_scale, state.v_scale = k, v
