"""FP8 KV-cache emulation for transformers attention modules (vLLM `kv_cache_dtype="fp8"`).

vLLM stores K (after k_norm and RoPE) and V in E4M3 with one per-tensor scale per layer
(`k_scale`, `v_scale`: dequantization multipliers, 1.0 when the checkpoint or the trainer's
calibration gives none), and attention reads them back: `k̂ = RTNE_sat(k / k_scale) * k_scale`.

Here the same quantize-dequantize is applied to the key/value tensors that a transformers
attention module hands to its attention function (they are exactly the cached K/V: post-norm,
post-RoPE, past plus current tokens). This is done by registering a wrapping attention
implementation (`fp8kv_<inner>`, plus the inner one's mask function) with transformers'
`AttentionInterface`, so no model code is copied. With a static scale the function is applied
element by element, so re-quantizing past tokens each step equals quantizing them once on write.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from nemo_fp8_rl.fp8.formats import E4M3, cast_to_fp8

_PREFIX = "fp8kv_"


@dataclass
class FP8KVCacheState:
    """Per-attention-layer FP8 KV settings: the scales and on/off and calibration switches."""

    k_scale: float = 1.0
    v_scale: float = 1.0
    fp8_enabled: bool = True
    calibrating: bool = False
    k_amax: float = 0.0
    v_amax: float = 0.0


def quantize_kv(t: torch.Tensor, scale: float) -> torch.Tensor:
    """E4M3 per-tensor quantize-dequantize with a fixed dequant multiplier `scale`:
    `RTNE_sat(fp32(t) * (1/scale)) * scale`, returned in `t`'s dtype."""
    inv = torch.tensor(1.0 / scale, dtype=torch.float32)
    q = cast_to_fp8(t.to(torch.float32) * inv, E4M3)
    return (q.to(torch.float32) * torch.tensor(scale, dtype=torch.float32)).to(t.dtype)


def _inner_function(module: nn.Module, inner: str) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if inner == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[inner]


def _make_wrapper(inner: str) -> Callable:
    def attention(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
        state = getattr(module, "fp8_kv_state", None)
        if state is not None and state.calibrating:
            state.k_amax = max(state.k_amax, float(key.detach().abs().amax()))
            state.v_amax = max(state.v_amax, float(value.detach().abs().amax()))
        elif state is not None and state.fp8_enabled:
            key, value = quantize_kv(key, state.k_scale), quantize_kv(value, state.v_scale)
        return _inner_function(module, inner)(module, query, key, value, attention_mask, **kwargs)

    return attention


def _register(inner: str) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = _PREFIX + inner
    AttentionInterface.register(name, _make_wrapper(inner))
    if inner in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    return name


# Register the wrappers of the common implementations at import, so that a converted model
# unpickled in another process (e.g. sent to a Ray actor) finds its attention function there.
for _inner in ("sdpa", "eager"):
    _register(_inner)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "v_proj")]


def enable_fp8_kv_cache_emulation(
    model: nn.Module, *, k_scale: float = 1.0, v_scale: float = 1.0
) -> nn.Module:
    """Quantize-dequantize K and V to E4M3 with per-tensor scales in every attention layer.

    `model` must be a transformers model (it needs `model.config._attn_implementation`); every
    submodule with `k_proj` and `v_proj` gets an `fp8_kv_state`. Returns `model`.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise TypeError("enable_fp8_kv_cache_emulation needs a transformers model with a `config`")
    layers = _attention_modules(model)
    if not layers:
        raise ValueError("no attention modules (with k_proj and v_proj) found in the model")
    for scale, what in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if not (scale > 0 and scale < float("inf")):
            raise ValueError(
                f"{what} must be a positive finite dequantization multiplier, got {scale}"
            )
    current = config._attn_implementation or "sdpa"
    if not current.startswith(_PREFIX):
        config._attn_implementation = _register(current)
    for layer in layers:
        layer.fp8_kv_state = FP8KVCacheState(k_scale=k_scale, v_scale=v_scale)
    return model


def kv_states(model: nn.Module) -> Iterator[FP8KVCacheState]:
    """The `FP8KVCacheState` of every attention layer of `model`, in module order."""
    for mod in model.modules():
        state = getattr(mod, "fp8_kv_state", None)
        if isinstance(state, FP8KVCacheState):
            yield state


@contextmanager
def calibrate_kv_scales(model: nn.Module) -> Iterator[nn.Module]:
    """Record K/V amax over the forwards run inside the block (FP8 KV off meanwhile), then set
    each layer's `k_scale = amax_k / 448` and `v_scale = amax_v / 448` (1.0 if amax is 0)."""
    states = list(kv_states(model))
    if not states:
        raise ValueError("call enable_fp8_kv_cache_emulation(model) before calibrating KV scales")
    for s in states:
        s.calibrating, s.k_amax, s.v_amax = True, 0.0, 0.0
    try:
        yield model
    finally:
        for s in states:
            s.calibrating = False
            s.k_scale = s.k_amax / E4M3.max if s.k_amax > 0 else 1.0
            s.v_scale = s.v_amax / E4M3.max if s.v_amax > 0 else 1.0
