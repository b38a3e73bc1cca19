"""Triton path of `quantize_blockwise_like_nemo_rl` on CUDA (import needs `triton`).

Two passes over the weight, one program per `b x b` block each:

1. `_block_amax`: max |x| of the block's real elements (masked loads read 0, which never raises
   an amax) and a count of NaN/Inf elements;
2. NeMo RL's padding rule on the small amax tensor (blocks of the last block-row / column,
   when that dim is padded, take `max(amax, |x[-1, -1]|)`), then NeMo RL's scales with the
   same torch operations as the reference (`nemo_scales`, on the GPU);
3. `_scaled_cast`: `q = e4m3(clamp(x * scale, -448, 448))`, FP32 multiply and the hardware's
   round-to-nearest-even cast, equal to torch's cast for the finite values in [-448, 448] it
   sees.

It returns None (the caller runs the torch reference on the GPU) when the weight holds NaN/Inf
or a block's scale is not finite (amax below ~2^-119), the cases where NaN handling of the min/
max and of the cast would have to match torch's.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nemo_fp8_rl.refit.nemo_scale import E4M3_MAX, nemo_scales

_FLT_MAX = 3.4028234663852886e38


@triton.jit
def _block_amax(
    x_ptr, amax_ptr, bad_ptr, M, N, stride_m, n_nb, B: tl.constexpr, FLT_MAX: tl.constexpr
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * B + tl.arange(0, B)
    cols = pid_n * B + tl.arange(0, B)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
    mag = tl.abs(x.to(tl.float32))
    finite = mag <= FLT_MAX  # false for inf and NaN
    bad = tl.sum(tl.sum((mask & ~finite).to(tl.int32), axis=1), axis=0)
    amax = tl.max(tl.max(tl.where(finite, mag, 0.0), axis=1), axis=0)
    tl.store(amax_ptr + pid_m * n_nb + pid_n, amax)
    tl.atomic_add(bad_ptr, bad)


@triton.jit
def _scaled_cast(
    x_ptr, s_ptr, q_ptr, M, N, stride_xm, stride_qm, n_nb, B: tl.constexpr, FP8_MAX: tl.constexpr
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rows = pid_m * B + tl.arange(0, B)
    cols = pid_n * B + tl.arange(0, B)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    scale = tl.load(s_ptr + pid_m * n_nb + pid_n)
    y = x.to(tl.float32) * scale
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    tl.store(
        q_ptr + rows[:, None] * stride_qm + cols[None, :], y.to(q_ptr.dtype.element_ty), mask=mask
    )


def quantize_triton(
    weight: torch.Tensor, b: int, pow2: bool, out_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(q, scale_inv)` of a 2-D CUDA weight by NeMo RL's rules, or None (see module doc).

    `out_dtype=torch.float32` writes the clamped products before the cast: how the arithmetic
    is checked on CPU under `TRITON_INTERPRET=1`, whose float8 conversion is not RTNE.
    """
    x = weight if weight.stride(-1) == 1 else weight.contiguous()
    m, n = x.shape
    mb, nb = math.ceil(m / b), math.ceil(n / b)
    amax = torch.empty((mb, nb), dtype=torch.float32, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    _block_amax[(mb, nb)](x, amax, bad, m, n, x.stride(0), nb, B=b, FLT_MAX=_FLT_MAX, num_warps=8)
    last = x[-1, -1].abs().to(torch.float32)
    if m % b:
        amax[-1] = torch.maximum(amax[-1], last)
    if n % b:
        amax[:, -1] = torch.maximum(amax[:, -1], last)
    scale, scale_inv = nemo_scales(amax.view(mb, nb, 1), pow2)
    if int(bad.item()) or not bool(torch.isfinite(scale).all()):
        return None
    q = torch.empty((m, n), dtype=out_dtype, device=x.device)
    _scaled_cast[(mb, nb)](
        x, scale, q, m, n, x.stride(0), q.stride(0), nb, B=b, FP8_MAX=E4M3_MAX, num_warps=8
    )
    return q, scale_inv.squeeze(-1)
