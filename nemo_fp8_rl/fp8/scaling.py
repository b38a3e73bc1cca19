"""Scale derivation from amax, exactly as Transformer Engine's `compute_scale_from_amax`.

For each tile with absolute maximum `amax` (FP32), format maximum `fp8_max` and floor `eps`:

1. `amax = eps` if `amax < eps` (a NaN amax compares false and falls through);
2. `scale = 1` if amax is 0, inf or NaN (nothing to scale, or nothing sane to scale by);
3. otherwise `scale = fp8_max / amax` (FP32, round-to-nearest division);
4. `scale = FLT_MAX` if that overflowed to inf (amax below fp8_max / FLT_MAX);
5. pow2 scales: zero the 23 mantissa bits, i.e. `scale = 2^floor(log2(scale))`, so that
   `|x| * scale <= fp8_max` still holds and `scale_inv` is an exact power of two;
6. `scale_inv = 1 / scale` (FP32), the dequantization multiplier vLLM calls `weight_scale_inv`.

MXFP8 (TE `MXFP8BlockScaling`) derives an E8M0 exponent instead, see `e8m0_scale_from_amax`.
"""

from __future__ import annotations

import torch

FLT_MAX = torch.finfo(torch.float32).max
_EXPONENT_MASK = -8388608  # 0xFF800000 as a signed int32: sign + exponent bits


def scale_from_amax(
    amax: torch.Tensor, fp8_max: float, *, pow2: bool, eps: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(scale, scale_inv)` in FP32 for a tensor of per-tile amax values (TE's rule, above)."""
    amax = amax.to(torch.float32)
    if eps > 0.0:
        amax = torch.where(amax < eps, torch.full_like(amax, eps), amax)
    special = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
    scale = torch.full_like(amax, fp8_max) / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
    if pow2:
        scale = (scale.view(torch.int32) & _EXPONENT_MASK).view(torch.float32)
    scale = torch.where(special, torch.ones_like(scale), scale)
    return scale, torch.reciprocal(scale)


def e8m0_scale_from_amax(amax: torch.Tensor, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 scales exactly as TE computes them; returns `(scale, scale_inv)` in FP32.

    `v = fp32(amax * fp32(1 / fp8_max))`; E8M0 biased exponent `e = ceil(log2 v) + 127`
    (NaN -> 255, inf -> 254; a subnormal v <= 2^-127 -> 0; saturating at 254), i.e. the scale
    is a power of two rounded *up* so that `|x| * scale <= fp8_max`; then
    `scale = 1 if e == 0 else 2^(127 - e)` (TE's `exp2f_rcp`) and `scale_inv = 2^(e - 127)`.
    """
    v = amax.to(torch.float32) * torch.tensor(1.0 / fp8_max, dtype=torch.float32)
    bits = v.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + round_up.to(torch.int32)
    e = torch.where(torch.isinf(v), torch.full_like(e, 254), e)
    e = torch.where(torch.isnan(v), torch.full_like(e, 255), e)
    one = torch.ones_like(v)
    scale = torch.where(e == 0, one, torch.ldexp(one, (127 - e).to(torch.float32)))
    scale_inv = torch.ldexp(one, (e - 127).to(torch.float32))
    scale_inv = torch.where(e == 255, torch.full_like(v, float("nan")), scale_inv)
    return scale, scale_inv


def scales_for(
    amax: torch.Tensor, fp8_max: float, scale_kind: str, eps: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(scale, scale_inv)` for a spec's scale kind: "fp32", "pow2" (TE rule) or "e8m0" (MXFP8)."""
    if scale_kind == "e8m0":
        return e8m0_scale_from_amax(amax, fp8_max)
    return scale_from_amax(amax, fp8_max, pow2=scale_kind == "pow2", eps=eps)
