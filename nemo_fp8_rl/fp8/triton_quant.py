"""Triton GPU kernel for blockwise (128x128) and rowwise (1x128) FP8 quantization.

One program per tile group fuses the whole quantizer in a single read of the input:
amax over the tile, TE's scale rule (`scaling.py`: epsilon floor, scale 1 for 0/inf/NaN amax,
round-to-nearest division, FLT_MAX for an overflowing scale, optional power-of-2 rounding by
masking the mantissa), the scaled saturating RTNE cast (`cvt.rn.satfinite` on sm89+), and the
`scale_inv = 1/scale` store. Divisions use `div_rn` so they are IEEE-exact like the CPU path.
It also counts non-finite elements per tile; if there are any, the caller falls back to the
reference path, which raises or saturates exactly as documented. Import needs `triton`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nemo_fp8_rl.fp8.spec import BLOCK_LEN, FP8Spec

_FLT_MAX = 3.4028234663852886e38
_TL_DTYPES = {
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e5m2: tl.float8e5,
    torch.float32: tl.float32,
}


@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, s_ptr, bad_ptr, M, K, stride_xm, stride_qm, n_kb,
    FP8_MAX: tl.constexpr, FLT_MAX: tl.constexpr, EPS: tl.constexpr, POW2: tl.constexpr,
    ROWWISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, OUT_DTYPE: tl.constexpr,
):  # fmt: skip
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    finite = tl.abs(x) <= FLT_MAX  # false for inf and NaN
    bad = tl.sum(tl.sum((mask & ~finite).to(tl.int32), axis=1), axis=0)
    mag = tl.where(finite, tl.abs(x), 0.0)
    amax = tl.max(mag, axis=1, keep_dims=True)  # (BLOCK_M, 1): one 1x128 group per row
    if not ROWWISE:
        amax = tl.max(amax, axis=0, keep_dims=True)  # (1, 1): the 128x128 tile
    amax = tl.where(amax < EPS, EPS, amax)
    special = amax == 0.0  # inf/NaN tiles never get here: the caller falls back
    fp8_max = tl.full(amax.shape, FP8_MAX, tl.float32)
    scale = tl.math.div_rn(fp8_max, tl.where(special, 1.0, amax))
    scale = tl.where(scale > FLT_MAX, FLT_MAX, scale)
    if POW2:
        scale = (scale.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)
    scale = tl.where(special, 1.0, scale)
    scale_inv = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    y = tl.minimum(tl.maximum(x * scale, -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], y.to(OUT_DTYPE), mask=mask)
    if ROWWISE:
        tl.store(s_ptr + rows[:, None] * n_kb + pid_k, scale_inv, mask=rows[:, None] < M)
    else:
        tl.store(s_ptr + pid_m * n_kb + pid_k + tl.zeros([1, 1], tl.int32), scale_inv)
    tl.atomic_add(bad_ptr, bad)


def quantize_blockwise_triton(
    x: torch.Tensor, spec: FP8Spec
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Blockwise or rowwise quantization of a CUDA tensor with the fused kernel.

    Returns `(q, scale_inv)` bit-identical to `quantize`, or None when the input holds NaN/Inf
    (the caller then uses the reference path). Raises ValueError for other granularities.
    """
    return launch_quantize_kernel(x, spec, spec.format.dtype)


def launch_quantize_kernel(
    x: torch.Tensor, spec: FP8Spec, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Run the kernel writing `out_dtype`: the FP8 dtype, or float32 to get the scaled, clamped
    values before the cast (how the kernel's arithmetic is checked under `TRITON_INTERPRET=1`,
    whose float8 conversion is not RTNE)."""
    if spec.granularity not in ("blockwise", "rowwise"):
        raise ValueError(
            f"the Triton kernel covers blockwise and rowwise, not {spec.granularity!r}"
        )
    if spec.granularity == "blockwise" and x.dim() != 2:
        raise ValueError(f"blockwise quantization needs a 2-D weight, got shape {list(x.shape)}")
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    m, k = x2d.shape
    n_kb = math.ceil(k / BLOCK_LEN)
    fmt = spec.format
    q = torch.empty((m, k), dtype=out_dtype, device=x.device)
    rowwise = spec.granularity == "rowwise"
    block_m = 32 if rowwise else BLOCK_LEN
    n_mb = math.ceil(m / block_m)
    s_rows = m if rowwise else n_mb
    scale_inv = torch.empty((s_rows, n_kb), dtype=torch.float32, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    _quantize_kernel[(n_mb, n_kb)](
        x2d, q, scale_inv, bad, m, k, x2d.stride(0), q.stride(0), n_kb,
        FP8_MAX=fmt.max, FLT_MAX=_FLT_MAX, EPS=spec.amax_epsilon, POW2=spec.pow2, ROWWISE=rowwise,
        BLOCK_M=block_m, BLOCK_K=BLOCK_LEN, OUT_DTYPE=_TL_DTYPES[out_dtype],
    )  # fmt: skip
    if int(bad.item()):
        return None
    if rowwise:
        scale_inv = scale_inv.reshape(*x.shape[:-1], n_kb)
    return q.reshape(x.shape), scale_inv
