"""CPU fast path for `quantize`: chunked, cache-resident, allocation-free passes.

Same arithmetic as the reference path in `quantize.py` (so the results are bit-identical), but:

- amax comes from the raw bits: for IEEE formats `|x|` orders like the integer `bits & 0x7F..F`,
  so a masked integer max (vectorised, 16 lanes for BF16) replaces `abs().amax()`; a maximum at
  or above the infinity pattern flags a non-finite tile (then the caller falls back);
- blockwise tiles reduce over rows first (a vertical, fully vectorised max), then 128 columns;
- each chunk of ~1M elements is upcast into one reused FP32 buffer (`copy_`), scaled in place
  (`mul_` by the broadcast tile scales) and cast into its slice of the output (`copy_`), so no
  pass allocates and the temporaries stay in cache. The float8 cast dominates what remains.
"""

from __future__ import annotations

import math

import torch

from nemo_fp8_rl.fp8.scaling import scales_for
from nemo_fp8_rl.fp8.spec import BLOCK_LEN, MX_BLOCK_LEN, FP8Spec

_CHUNK_ELEMS = 1 << 20
# dtype -> (integer view dtype, magnitude mask, bit pattern of +inf)
_BITS = {
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
}


def _bits_to_float(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Magnitude bit patterns (as produced by the masked max) back to FP32 values."""
    if dtype == torch.bfloat16:
        return (bits.to(torch.int32) << 16).view(torch.float32)
    if dtype == torch.float16:
        return bits.view(torch.float16).to(torch.float32)
    return bits.view(torch.float32)


def _tile_amax_bits(mag: torch.Tensor, granularity: str) -> torch.Tensor:
    """Per-tile max of magnitude bits for one `(rows, K)` chunk, broadcastable over the chunk
    viewed as `(rows, kb, group)` (rowwise/mxfp8), `(rows/128, 128, kb, 128)` (blockwise; rows
    zero-padded to a multiple of 128) or `(rows, K)` (per_channel/tensorwise)."""
    rows, k = mag.shape
    if granularity in ("rowwise", "mxfp8"):
        group = MX_BLOCK_LEN if granularity == "mxfp8" else BLOCK_LEN
        return mag.view(rows, k // group, group).amax(-1, keepdim=True)
    if granularity == "blockwise":
        rb, kb = rows // BLOCK_LEN, k // BLOCK_LEN
        cols = mag.view(rb, BLOCK_LEN, k).amax(1)  # vertical max first: fully vectorised
        return cols.view(rb, 1, kb, BLOCK_LEN).amax(-1, keepdim=True)
    if granularity == "per_channel":
        return mag.amax(1, keepdim=True)
    return mag.amax().reshape(1, 1)


def _rows_per_chunk(m: int, k: int, granularity: str) -> int:
    rows = max(1, _CHUNK_ELEMS // max(k, 1))
    if granularity == "blockwise":  # whole block-rows per chunk (the last one zero-padded)
        return max(BLOCK_LEN, rows // BLOCK_LEN * BLOCK_LEN)
    return min(rows, m)


def _global_amax_bits(bits: torch.Tensor, mask: int, rows: int) -> torch.Tensor:
    """Tensorwise: masked integer max over the whole tensor, chunk by chunk."""
    best = torch.zeros((), dtype=bits.dtype)
    buf = torch.empty(rows * bits.shape[1], dtype=bits.dtype)
    for i in range(0, bits.shape[0], rows):
        chunk = bits[i : i + rows]
        mag = torch.bitwise_and(chunk, mask, out=buf[: chunk.numel()].view(chunk.shape))
        best = torch.maximum(best, mag.amax())
    return best.reshape(1, 1)


def quantize_chunked(x: torch.Tensor, spec: FP8Spec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Fast CPU quantization, bit-identical to the reference; None where it does not apply
    (non-CPU tensor, K not a multiple of 128 for tiled granularities, non-finite values)."""
    if x.device.type != "cpu" or x.dtype not in _BITS or x.dim() == 0 or x.numel() == 0:
        return None
    gran = spec.granularity
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = x2d.shape
    group = MX_BLOCK_LEN if gran == "mxfp8" else BLOCK_LEN
    if gran in ("rowwise", "blockwise", "mxfp8") and k % group:
        return None
    int_dtype, mask, inf_bits = _BITS[x.dtype]
    bits, fmt = x2d.view(int_dtype), spec.format
    rows = _rows_per_chunk(m, k, gran)
    mag_buf = torch.empty(rows * k, dtype=int_dtype)
    f_buf = torch.empty(rows * k, dtype=torch.float32)
    q = torch.empty((m, k), dtype=fmt.dtype)
    global_bits = _global_amax_bits(bits, mask, rows) if gran == "tensorwise" else None
    scales = []
    for i in range(0, m, rows):
        r = min(rows, m - i)
        rp = -(-r // BLOCK_LEN) * BLOCK_LEN if gran == "blockwise" else r
        if global_bits is None:
            mag = mag_buf[: rp * k].view(rp, k)
            torch.bitwise_and(bits[i : i + r], mask, out=mag[:r])
            mag[r:].zero_()  # padding rows of a partial block-row never raise the amax
            amax_bits = _tile_amax_bits(mag, gran)
        else:
            amax_bits = global_bits
        if int(amax_bits.max()) >= inf_bits:
            return None
        amax = _bits_to_float(amax_bits, x.dtype)
        scale, scale_inv = scales_for(amax, fmt.max, spec.scale, eps=spec.amax_epsilon)
        scales.append(scale_inv)
        f = f_buf[: rp * k].view(rp, k)
        f[:r].copy_(x2d[i : i + r])
        _scaled_view(f, scale, group).mul_(scale)
        if fmt.name != "e4m3":  # torch saturates E4M3 itself; E5M2 would overflow to inf
            f[:r].clamp_(-fmt.max, fmt.max)
        q[i : i + r].copy_(f[:r])
    return q.reshape(x.shape), _collect_scales(scales, x.shape, gran)


def _scaled_view(f: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """`f` viewed so that `scale` (from `_tile_amax_bits`) broadcasts over its tiles."""
    rows, k = f.shape
    if scale.dim() == 4:
        return f.view(rows // BLOCK_LEN, BLOCK_LEN, k // BLOCK_LEN, BLOCK_LEN)
    if scale.dim() == 3:
        return f.view(rows, k // group, group)
    return f


def _collect_scales(scales: list[torch.Tensor], shape: torch.Size, gran: str) -> torch.Tensor:
    if gran == "tensorwise":
        return scales[0].reshape(())
    if gran == "blockwise":
        kb = math.ceil(shape[-1] / BLOCK_LEN)
        return torch.cat([s.reshape(-1, kb) for s in scales], 0)
    if gran == "per_channel":
        return torch.cat([s.reshape(-1, 1) for s in scales], 0).reshape(*shape[:-1], 1)
    kb = math.ceil(shape[-1] / (MX_BLOCK_LEN if gran == "mxfp8" else BLOCK_LEN))
    return torch.cat([s.reshape(-1, kb) for s in scales], 0).reshape(*shape[:-1], kb)
