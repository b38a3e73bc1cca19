"""Block FP8 quantization bit-identical to NeMo RL's vLLM-side refit quantizer.

NeMo RL's vLLM worker requantizes every FP8 weight at each refit with
`cast_tensor_to_fp8_blockwise` (`nemo_rl/models/generation/vllm/quantization/fp8.py`, the same
function in v0.7.0 and 7ea279a). `quantize_blockwise_like_nemo_rl` produces the same bytes on
the trainer, so the pair can travel instead of the BF16 weight. Its rules, for a 2-D weight `x`
taken to FP32 and square `b x b` blocks (b = 128):

- padding: a dim that is not a multiple of b is padded with the value of the LAST element
  `x[-1, -1]` (not zeros), so every block of the last block-row / block-column has
  `amax >= |x[-1, -1]|`; the padding is cropped from the output;
- `amax` = max |x| over each padded block (FP32; NaN propagates);
- fp32 scales: `scale = fp32(fp32(1 / amax) * 448)` (torch evaluates `448 / t` as
  `t.reciprocal() * 448`, which is not the correctly rounded quotient), then `scale = 1` where
  amax is 0 or inf; an amax below ~2^-119 gives `scale = inf` (kept: zeros then become NaN);
- pow2 scales (`use_weight_pow2_scale`, NeMo RL's `pow2_weight_scaling_factors`): an E8M0
  exponent `e = uint8(clamp(ceil(log2(amax / 448)), -127, 127) + 127)`,
  `scale = 1 if e == 0 else 2^(127 - e)` (so a zero block and an inf block get 1 and 2^-127);
- `scale_inv = fp32(1 / scale)`, shape `(ceil(M/b), ceil(N/b))` (NeMo RL returns it with a
  trailing 1 that its `load_weights` squeezes off before `model.load_weights`);
- `q = e4m3fn(clamp(fp32(x * scale), -448, 448))` (torch's round-to-nearest-even cast).

The scale step runs the same torch operations on a same-shaped, contiguous FP32 amax tensor on
the weight's device, because `ceil(log2(.))` of a value just above a power of two depends on
the log2 implementation's last-bit rounding (SLEEF / libm on CPU, libdevice on CUDA), and
torch's CPU kernels switch between vectorised and scalar code by position. Only the amax and
the element pass are the project's own kernels: a chunked, cache-resident CPU pass here and a
Triton pass on CUDA (`nemo_quant_triton.py`); NaN/Inf inputs and, on CPU, dims that are not
multiples of b take the plain torch path `quantize_reference`, ordered as NeMo RL orders it (so
even NaN payloads agree).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nemo_fp8_rl.refit.nemo_scale import BLOCK, E4M3_MAX, nemo_scales

_CHUNK_ELEMS = 1 << 20
# dtype -> (integer view, magnitude mask, bit pattern of +inf)
_BITS = {
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
}


def _check(weight: torch.Tensor, block: tuple[int, int]) -> int:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        shape = list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"block FP8 quantization needs a 2-D weight, got {shape}")
    if weight.dtype not in _BITS:
        raise TypeError(
            f"block FP8 quantization takes float32/bfloat16/float16, got {weight.dtype}"
        )
    if len(block) != 2 or block[0] != block[1] or block[0] < 1:
        raise ValueError(f"NeMo RL's quantizer uses square blocks, got {tuple(block)}")
    if weight.numel() == 0:
        raise ValueError(f"cannot quantize an empty weight of shape {list(weight.shape)}")
    return int(block[0])


def quantize_blockwise_like_nemo_rl(
    weight: torch.Tensor, *, block: tuple[int, int] = (BLOCK, BLOCK), pow2_scale: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D weight exactly as NeMo RL's vLLM worker does at refit.

    Returns `(q, scale_inv)`: `q` float8_e4m3fn of the weight's shape, `scale_inv` FP32 of
    shape `(ceil(M/b), ceil(N/b))`, on the weight's device; bit-identical to NeMo RL's
    `cast_tensor_to_fp8_blockwise(weight.float(), [b, b])` with the trailing scale dim squeezed
    (what its `load_weights` hands to vLLM as `<name>` and `<name>_scale_inv`).
    """
    b = _check(weight, block)
    result = None
    if weight.is_cuda:
        try:
            from nemo_fp8_rl.refit.nemo_quant_triton import quantize_triton
        except ImportError:  # no triton: the torch path runs on the GPU too
            quantize_triton = None
        if quantize_triton is not None:
            result = quantize_triton(weight, b, pow2_scale)
    elif weight.device.type == "cpu":
        result = quantize_chunked(weight, b, pow2_scale)
    if result is None:
        result = quantize_reference(weight, b, pow2_scale)
    return result


def quantize_reference(
    weight: torch.Tensor, b: int, pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain torch path: every shape, NaN/Inf, any device (see the module docstring)."""
    x = weight.to(torch.float32)
    m, n = x.shape
    mb, nb = math.ceil(m / b), math.ceil(n / b)
    if (mb * b, nb * b) != (m, n):
        x = F.pad(x, (0, nb * b - n, 0, mb * b - m), value=float(x[-1, -1]))
    # (Mb, Nb, b*b) rows, one block each, in NeMo RL's element order.
    tiles = x.reshape(mb, b, nb, b).permute(0, 2, 1, 3).contiguous().flatten(start_dim=2)
    amax = torch.amax(torch.abs(tiles), dim=-1, keepdim=True)
    scale, scale_inv = nemo_scales(amax, pow2)
    q = torch.clamp(tiles * scale, min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)
    q = q.view(mb, nb, b, b).permute(0, 2, 1, 3).reshape(mb * b, nb * b)[:m, :n]
    return q.contiguous(), scale_inv.squeeze(-1)


def _block_amax(x: torch.Tensor, b: int) -> torch.Tensor | None:
    """FP32 `(Mb, Nb)` block amax of an aligned CPU weight from its magnitude bits (for IEEE
    formats |x| orders like the integer `bits & 0x7F..F`), a chunk of block-rows at a time;
    None when a block holds NaN/Inf (their patterns are the largest)."""
    int_dtype, mask, inf_bits = _BITS[x.dtype]
    m, n = x.shape
    bits = x.view(int_dtype)
    rows = max(b, _CHUNK_ELEMS // max(n, 1) // b * b)
    buf = torch.empty(rows * n, dtype=int_dtype)
    parts = []
    for i in range(0, m, rows):
        chunk = bits[i : i + rows]
        mag = torch.bitwise_and(chunk, mask, out=buf[: chunk.numel()].view(chunk.shape))
        cols = mag.view(-1, b, n).amax(1)  # vertical max first: fully vectorised
        parts.append(cols.view(-1, n // b, b).amax(-1))
    amax_bits = torch.cat(parts)
    if int(amax_bits.max()) >= inf_bits:
        return None
    if x.dtype == torch.bfloat16:
        return (amax_bits.to(torch.int32) << 16).view(torch.float32)
    if x.dtype == torch.float16:
        return amax_bits.view(torch.float16).to(torch.float32)
    return amax_bits.view(torch.float32)


def quantize_chunked(
    weight: torch.Tensor, b: int, pow2: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """CPU fast path for finite weights whose dims are multiples of b; None otherwise.

    Block amax from the raw bits, NeMo RL's scales on the `(Mb, Nb, 1)` amax, then per chunk of
    block-rows: upcast into one reused FP32 buffer, `mul_` by the broadcast block scales,
    `clamp_`, cast into the output slice: the same element operations as the reference, with
    no full-size temporaries.
    """
    m, n = weight.shape
    if weight.device.type != "cpu" or m % b or n % b:
        return None
    x = weight.contiguous()
    amax = _block_amax(x, b)
    if amax is None:
        return None
    mb, nb = m // b, n // b
    scale, scale_inv = nemo_scales(amax.reshape(mb, nb, 1).contiguous(), pow2)
    q = torch.empty((m, n), dtype=torch.float8_e4m3fn)
    rows = max(b, _CHUNK_ELEMS // n // b * b)
    buf = torch.empty(rows * n, dtype=torch.float32)
    for i in range(0, m, rows):
        r = min(rows, m - i)
        f = buf[: r * n].view(r, n)
        f.copy_(x[i : i + r])
        s = scale[i // b : (i + r) // b].view(r // b, 1, nb, 1)
        f.view(r // b, b, nb, b).mul_(s)
        f.clamp_(-E4M3_MAX, E4M3_MAX)
        q[i : i + r].copy_(f)
    return q, scale_inv.squeeze(-1)
