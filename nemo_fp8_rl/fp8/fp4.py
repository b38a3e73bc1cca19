"""4-bit formats: NVFP4 and MXFP4 (E2M1 values), as Transformer Engine's reference quantizer does.

E2M1 holds the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} and a sign (code = sign << 3 | magnitude
index). A tensor viewed as `(M, K)` is cut into tiles along K (or 16 x 16 tiles for NVFP4
weights) and each tile gets one scale:

**NVFP4** (TE `NVFP4BlockScaling`; tiles 1 x 16, or 16 x 16 for GEMM weights), two levels:

    g_enc  = min(448 * 6 / amax(X), FLT_MAX)   (1 when that is 0)   global FP32 encode scale
    g_dec  = 1 / g_enc
    s      = e4m3(clamp(min(amax(tile) * fp32(g_enc * fp32(1/6)), FLT_MAX), -448, 448))
    enc    = min(1 / (fp32(s) * g_dec), FLT_MAX)
    q      = E2M1(clamp(x * enc, -6, 6))            x̂ = q * fp32(s) * g_dec

**MXFP4** (TE's reference with power-of-2 scales; tiles 1 x 32):

    s = 2 ** clamp(ceil(log2(amax(tile) / 6)), -127, 127),   q = E2M1(clamp(x / s, -6, 6)),   x̂ = q * s

`E2M1()` rounds to the nearest magnitude with ties to the even code (0.25 -> 0, 0.75 -> 1,
1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), as TE's `cast_to_fp4x2`; a NaN gives code 0
there, and here too. Tiles are zero-padded at the edges (padding never raises an amax).
`tests/test_fp4.py` holds these against outputs of TE's own reference functions recorded by
`scripts/te_reference_cases.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

FP4Kind = Literal["nvfp4", "mxfp4"]
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max
# E2M1 magnitude boundaries between code i and i + 1; a tie goes to the even code.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class FP4Spec:
    """How to quantize one tensor to a 4-bit format: `kind` and tile shape `(rows, cols)`.

    NVFP4 takes tiles (1, 16) (activations, gradients) or (16, 16) (TE's 2-D weight tiles);
    MXFP4 takes (1, 32).
    """

    kind: FP4Kind = "nvfp4"
    tile: tuple[int, int] = (1, 16)

    def __post_init__(self) -> None:
        allowed = {"nvfp4": ((1, 16), (16, 16)), "mxfp4": ((1, 32),)}
        if self.kind not in allowed:
            raise ValueError(f"unknown 4-bit format {self.kind!r}: use 'nvfp4' or 'mxfp4'")
        if tuple(self.tile) not in allowed[self.kind]:
            raise ValueError(
                f"{self.kind} tiles are {' or '.join(map(str, allowed[self.kind]))}, got {self.tile}"
            )

    @property
    def granularity(self) -> str:
        """A name for logs and layer reprs, e.g. `nvfp4-16x16`."""
        return f"{self.kind}-{self.tile[0]}x{self.tile[1]}"

    @property
    def scale(self) -> str:
        """The block-scale format: `e4m3` (NVFP4, with an FP32 tensor scale) or `e8m0` (MXFP4)."""
        return "e4m3" if self.kind == "nvfp4" else "e8m0"


@dataclass(frozen=True)
class FP4Tensor:
    """A quantized tensor: E2M1 `codes` (uint8, one per element, x's shape), per-tile `scales`
    (NVFP4: float8_e4m3fn; MXFP4: FP32 powers of two) of shape `(ceil(M/rows), ceil(K/cols))`
    (1 x 16 tiles: `(M, ceil(K/16))`), and the FP32 `global_amax` (NVFP4; 0-d)."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_amax: torch.Tensor | None
    spec: FP4Spec


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of FP32 `y` already scaled into [-6, 6]: nearest
    magnitude, ties to the even code; negative values below 0.25 in magnitude give -0 (code 8),
    NaN gives code 0 (TE's `cast_to_fp4x2`)."""
    a = y.abs()
    mag = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for i, bound in enumerate(_BOUNDS):
        mag += (a >= bound if i % 2 else a > bound).to(torch.uint8)
    return mag | ((y < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (exact)."""
    table = torch.tensor(_MAGNITUDES + tuple(-m for m in _MAGNITUDES), dtype=torch.float32)
    return table.to(codes.device)[codes.long()]


def pack_fp4x2(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim (even element in the low nibble), TE's layout."""
    c = codes.reshape(-1, codes.shape[-1])
    return (c[:, ::2] + c[:, 1::2] * 16).to(torch.uint8)


def _tiled_amax(x2d: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad `(M, K)` to whole tiles; return the padded FP32 tensor viewed as
    `(Mb, rows, Kb, cols)` and the per-tile amax `(Mb, Kb)`."""
    m, k = x2d.shape
    mb, kb = math.ceil(m / rows), math.ceil(k / cols)
    xf = F.pad(x2d.to(torch.float32), (0, kb * cols - k, 0, mb * rows - m))
    tiles = xf.view(mb, rows, kb, cols)
    return tiles, tiles.abs().amax(dim=(1, 3))


def _nvfp4_scales(
    amax: torch.Tensor, global_amax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 block scales, FP32 encode multipliers, FP32 global decode scale): formula above."""
    f32 = torch.float32
    g_enc = torch.tensor(E4M3_MAX * E2M1_MAX, dtype=f32) / global_amax.to(f32)
    g_enc = torch.clamp(g_enc, max=FLT_MAX)
    g_enc = torch.where(g_enc == 0, torch.ones_like(g_enc), g_enc)
    g_dec = torch.tensor(1.0, dtype=f32) / g_enc
    mult = g_enc * torch.reciprocal(torch.tensor(E2M1_MAX, dtype=f32))
    s = torch.clamp(amax * mult, max=FLT_MAX).clamp(-E4M3_MAX, E4M3_MAX)
    s = s.to(torch.float8_e4m3fn)
    enc = torch.clamp(torch.tensor(1.0, dtype=f32) / (s.to(f32) * g_dec), max=FLT_MAX)
    return s, enc, g_dec


def _mxfp4_scales(amax: torch.Tensor) -> torch.Tensor:
    """FP32 power-of-2 decode scales 2^clamp(ceil(log2(amax / 6)), -127, 127)."""
    exponent = torch.ceil(torch.log2(amax / torch.tensor(E2M1_MAX, dtype=torch.float32)))
    exponent = torch.clamp(exponent, -127.0, 127.0)
    return torch.tensor(2.0, dtype=torch.float32) ** exponent


def quantize_fp4(x: torch.Tensor, spec: FP4Spec) -> FP4Tensor:
    """Quantize `x` (any float dtype, at least 1-D; viewed as `(M, K)`) per `spec` (module doc)."""
    if x.dim() == 0:
        raise ValueError("quantize_fp4 needs at least 1 dim, got a scalar")
    x2d = x.reshape(-1, x.shape[-1])
    rows, cols = spec.tile
    tiles, amax = _tiled_amax(x2d, rows, cols)
    if spec.kind == "nvfp4":
        global_amax = x2d.abs().amax().to(torch.float32) if x2d.numel() else torch.zeros(())
        scales, enc, _ = _nvfp4_scales(amax, global_amax)
    else:
        global_amax = None
        scales = _mxfp4_scales(amax)
        enc = torch.tensor(1.0, dtype=torch.float32) / scales
    scaled = torch.clamp(tiles * enc[:, None, :, None], -E2M1_MAX, E2M1_MAX)
    m, k = x2d.shape
    codes = e2m1_codes(scaled).reshape(tiles.shape[0] * rows, -1)[:m, :k].reshape(x.shape)
    return FP4Tensor(codes, scales, global_amax, spec)


def decode_scales(t: FP4Tensor) -> torch.Tensor:
    """Per-tile FP32 dequantization multipliers: NVFP4 `fp32(s) * g_dec`, MXFP4 `s`."""
    if t.spec.kind == "mxfp4":
        return t.scales
    _, _, g_dec = _nvfp4_scales(torch.zeros(1), t.global_amax)
    return t.scales.to(torch.float32) * g_dec


def dequantize_fp4(t: FP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`x̂ = E2M1 value * decode scale` per tile (FP32 product), cast to `dtype`."""
    shape = t.codes.shape
    c2d = t.codes.reshape(-1, shape[-1])
    rows, cols = t.spec.tile
    m, k = c2d.shape
    mb, kb = math.ceil(m / rows), math.ceil(k / cols)
    vals = F.pad(e2m1_values(c2d), (0, kb * cols - k, 0, mb * rows - m)).view(mb, rows, kb, cols)
    out = (vals * decode_scales(t)[:, None, :, None]).reshape(mb * rows, kb * cols)[:m, :k]
    return out.reshape(shape).to(dtype)


class _FakeQuantizeFP4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: FP4Spec) -> torch.Tensor:  # noqa: ANN001
        return dequantize_fp4(quantize_fp4(x, spec), dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


def fake_quantize_fp4(x: torch.Tensor, spec: FP4Spec) -> torch.Tensor:
    """Quantize-dequantize `x` (same dtype and shape) with a straight-through gradient, as
    quantization-aware training does (`dL/dx = dL/dy`)."""
    return _FakeQuantizeFP4.apply(x, spec)
