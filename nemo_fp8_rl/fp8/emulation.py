"""FP8 emulation modules for the embedded CPU engine: W8A8 linear layers and an FP8 KV cache.

`convert_to_fp8_emulation` swaps the `nn.Linear` modules of a model (a transformers Qwen3/Llama,
or any module tree) for `FP8EmulatedLinear`, in place, reusing the same parameter objects, so the
optimizer, the state dict and the model code stay as they are. Each converted layer computes

    y = bf16( fq_a(bf16(x)) @ fq_w(bf16(W))^T + b )

where `fq` is quantize-dequantize (`fake_quantize`): weights with `weight_spec` (128x128 blocks),
activations with `act_spec` (1x128 groups along K, per token), and `bf16()` rounds to BF16 so the
FP32 matmul emulates BF16 compute (BF16 matmuls are very slow on CPUs without BF16 units). The
specs may also be MXFP8 (1x32 blocks, E8M0 scales) or a 4-bit `FP4Spec` (NVFP4, MXFP4: W4A4).

Backward follows TE's blockwise recipe when `grad_spec` is given (output gradient G, input X):
    dX = fq_g_row(G) @ fq_w(W)              (G quantized 1x128 along N; with 1-D weight tiles,
                                             as MXFP8's, W is quantized along its output dim)
    dW = fq_g_col(G)^T @ fq_a_col(X)         (G and X quantized 1x128 along tokens, from BF16)
Without `grad_spec` the gradients are the straight-through ones: dX = G @ fq_w(W), dW = G^T fq_a(X).

`fp8_emulation(model, enabled=False)` runs the same modules with FP8 off (BF16 rounding kept):
the BF16 shadow pass used by calibration and diagnostics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from nemo_fp8_rl.fp8.fp4 import FP4Spec, fake_quantize_fp4
from nemo_fp8_rl.fp8.kv_cache import (
    FP8KVCacheState,
    calibrate_kv_scales,
    enable_fp8_kv_cache_emulation,
)
from nemo_fp8_rl.fp8.quantize import fake_quantize
from nemo_fp8_rl.fp8.spec import FP8Spec

__all__ = [
    "FP8EmulatedLinear",
    "calibrate_kv_scales",
    "convert_to_fp8_emulation",
    "enable_fp8_kv_cache_emulation",
    "fp8_emulation",
    "round_to_bf16",
]

ModuleFilter = Callable[[nn.Module, str], bool]
QuantSpec = FP8Spec | FP4Spec


def round_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Round `t` to the nearest BF16 value (RTNE) and return it in `t`'s dtype."""
    if t.dtype == torch.bfloat16:
        return t
    return t.to(torch.bfloat16).to(t.dtype)


def _fq(t: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    if isinstance(spec, FP4Spec):
        return fake_quantize_fp4(t.detach(), spec)
    return fake_quantize(t.detach(), spec)


def _maybe_bf16(t: torch.Tensor, bf16: bool) -> torch.Tensor:
    return round_to_bf16(t) if bf16 else t


class _FP8LinearFunction(torch.autograd.Function):
    """y = bf16(fq_a(x) @ w_q^T + b) with TE-blockwise-style FP8 gradients (module doc)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):  # noqa: ANN001, ANN205
        x_hp = _maybe_bf16(x.detach(), layer.bf16)
        x_q = _fq(x_hp, layer.act_spec)
        w_q = layer.quantized_weight()
        out = _maybe_bf16(F.linear(x_q, w_q, bias), layer.bf16)
        ctx.save_for_backward(x_hp, x_q, w_q)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x_hp, x_q, w_q = ctx.saved_tensors
        layer: FP8EmulatedLinear = ctx.layer
        g2 = grad.reshape(-1, grad.shape[-1])
        if layer.grad_spec is not None:
            g_row = _fq(g2, layer.grad_spec)
            g_col = _fq(g2.t().contiguous(), layer.grad_spec).t()
            x_col = _fq(x_hp.reshape(-1, x_hp.shape[-1]).t().contiguous(), layer.act_spec).t()
        else:
            g_row, g_col, x_col = g2, g2, x_q.reshape(-1, x_q.shape[-1])
        w_d = layer.dgrad_weight(w_q) if layer.grad_spec is not None else w_q
        dx = _maybe_bf16(g_row @ w_d, layer.bf16).reshape(*grad.shape[:-1], w_q.shape[1])
        dw = _maybe_bf16(g_col.t() @ x_col, layer.bf16)
        db = g2.sum(0) if ctx.has_bias else None
        return dx.to(x_hp.dtype), dw.to(w_q.dtype), db, None


class FP8EmulatedLinear(nn.Linear):
    """An `nn.Linear` computing W8A8 by fake quantization (see the module docstring).

    Holds the original `weight`/`bias` parameters (same objects), so it is a drop-in swap.
    `fp8_enabled=False` gives the BF16 path (only the BF16 rounding remains).
    """

    weight_spec: QuantSpec
    act_spec: QuantSpec
    grad_spec: QuantSpec | None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        *,
        weight_spec: QuantSpec,
        act_spec: QuantSpec,
        grad_spec: QuantSpec | None = None,
        bf16: bool = True,
    ) -> FP8EmulatedLinear:
        """Wrap `linear`'s parameters (shared, not copied) in an FP8-emulated layer."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.weight_spec, new.act_spec, new.grad_spec = weight_spec, act_spec, grad_spec
        new.bf16 = bf16
        new.fp8_enabled = True
        new._w_cache: tuple[tuple, torch.Tensor] | None = None
        return new

    def quantized_weight(self) -> torch.Tensor:
        """fq_w(bf16(W)), cached until the weight changes (tracked by its version counter)."""
        w = self.weight
        key = (w._version, w.data_ptr(), w.dtype, self.bf16, self.weight_spec)
        if self._w_cache is None or self._w_cache[0] != key:
            self._w_cache = (key, _fq(_maybe_bf16(w.detach(), self.bf16), self.weight_spec))
        return self._w_cache[1]

    def dgrad_weight(self, w_q: torch.Tensor) -> torch.Tensor:
        """The weight the input gradient multiplies: `w_q` for 2-D tiles (the same blocks either
        way), else `W` quantized along its output dim (TE's columnwise copy, e.g. MXFP8's 32 x 1
        blocks)."""
        spec = self.weight_spec
        if isinstance(spec, FP4Spec) or spec.granularity in ("blockwise", "tensorwise"):
            return w_q
        w = _maybe_bf16(self.weight.detach(), self.bf16)
        return _fq(w.t().contiguous(), spec).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """W8A8 fake-quant linear when `fp8_enabled`, else the BF16-rounded linear."""
        if not self.fp8_enabled:
            w = _maybe_bf16(self.weight, self.bf16)
            return _maybe_bf16(F.linear(_maybe_bf16(x, self.bf16), w, self.bias), self.bf16)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _FP8LinearFunction.apply(x, self.weight, self.bias, self)
        x_q = _fq(_maybe_bf16(x, self.bf16), self.act_spec)
        return _maybe_bf16(F.linear(x_q, self.quantized_weight(), self.bias), self.bf16)

    def extra_repr(self) -> str:
        """Shape plus the FP8 settings."""
        return (
            f"{super().extra_repr()}, weight={self.weight_spec.granularity}/{self.weight_spec.scale}, "
            f"act={self.act_spec.granularity}, grad={self.grad_spec and self.grad_spec.granularity}, "
            f"bf16={self.bf16}, fp8_enabled={self.fp8_enabled}"
        )


def _as_spec(spec: QuantSpec | str, what: str) -> QuantSpec:
    if isinstance(spec, str):
        return FP8Spec.preset(spec)
    if not isinstance(spec, (FP8Spec, FP4Spec)):
        raise TypeError(
            f"{what} must be an FP8Spec, an FP4Spec or a preset name, got {type(spec).__name__}"
        )
    return spec


def _default_filter(model: nn.Module) -> ModuleFilter:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def keep(module: nn.Module, fqn: str) -> bool:
        leaf = fqn.rsplit(".", 1)[-1]
        return module is not out and leaf != "lm_head" and "embed" not in leaf

    return keep


def convert_to_fp8_emulation(
    model: nn.Module,
    *,
    weight_spec: QuantSpec | str,
    act_spec: QuantSpec | str,
    grad_spec: QuantSpec | str | None = None,
    module_filter_fn: ModuleFilter | None = None,
    bf16: bool = True,
) -> nn.Module:
    """Swap `nn.Linear` modules of `model` for `FP8EmulatedLinear`, in place; return `model`.

    `module_filter_fn(module, fqn) -> bool` chooses the layers; by default every Linear except
    the LM head (the model's output embeddings, or any module named `lm_head`) and embeddings.
    Already converted layers are left alone.
    """
    weight_spec = _as_spec(weight_spec, "weight_spec")
    act_spec = _as_spec(act_spec, "act_spec")
    grad_spec = None if grad_spec is None else _as_spec(grad_spec, "grad_spec")
    for what, spec in (("act_spec", act_spec), ("grad_spec", grad_spec)):
        if spec is not None and spec.granularity == "blockwise":
            raise ValueError(
                f"{what}: activations and gradients have any number of tokens; quantize them "
                "'rowwise' (1x128 per token group, as TE and vLLM do), not 'blockwise'"
            )
    keep = module_filter_fn or _default_filter(model)
    targets = [
        (fqn, mod)
        for fqn, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not isinstance(mod, FP8EmulatedLinear) and keep(mod, fqn)
    ]
    for fqn, mod in targets:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        new = FP8EmulatedLinear.from_linear(
            mod, weight_spec=weight_spec, act_spec=act_spec, grad_spec=grad_spec, bf16=bf16
        )
        setattr(parent, child, new)
    return model


def _switchables(model: nn.Module) -> Iterator[FP8EmulatedLinear | FP8KVCacheState]:
    for mod in model.modules():
        if isinstance(mod, FP8EmulatedLinear):
            yield mod
        state = getattr(mod, "fp8_kv_state", None)
        if isinstance(state, FP8KVCacheState):
            yield state


@contextmanager
def fp8_emulation(model: nn.Module, enabled: bool = False) -> Iterator[nn.Module]:
    """Turn FP8 emulation (linears and KV cache) on or off inside the block, then restore it."""
    items = list(_switchables(model))
    before = [item.fp8_enabled for item in items]
    for item in items:
        item.fp8_enabled = enabled
    try:
        yield model
    finally:
        for item, was in zip(items, before, strict=True):
            item.fp8_enabled = was
