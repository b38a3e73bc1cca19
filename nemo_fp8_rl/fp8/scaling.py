"""Scale derivation from amax, exactly as Transformer Engine's `compute_scale_from_amax`.

For each tile with absolute maximum `amax` (FP32), format maximum `fp8_max` and floor `eps`:

1. `amax = eps` if `amax < eps` (a NaN amax compares false and falls through);
2. `scale = 1` if amax is 0, inf or NaN (nothing to scale, or nothing sane to scale by);
3. otherwise `scale = fp8_max / amax` (FP32, round-to-nearest division);
4. `scale = FLT_MAX` if that overflowed to inf (amax below fp8_max / FLT_MAX);
5. pow2 scales: zero the 23 mantissa bits, i.e. `scale = 2^floor(log2(scale))`, so that
   `|x| * scale <= fp8_max` still holds and `scale_inv` is an exact power of two;
6. `scale_inv = 1 / scale` (FP32), the dequantization multiplier vLLM calls `weight_scale_inv`.
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
