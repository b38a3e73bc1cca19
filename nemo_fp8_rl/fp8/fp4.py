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

**Variants** (NVFP4 only; the rescue study's arms, not TE's reference): a per-row global scale
(`global_scale="row"`: `g_enc` from each row's amax instead of the tensor's, i.e. one FP32 scale
per token for activations) and "4/6" adaptive block scaling (`four_over_six`, arXiv 2512.02010):
each tile is also quantized with its amax mapped to 4 (`s4 = e4m3(amax * g_enc / 4)`, the E2M1
grid then denser near the tile's maximum, 6 unused unless the scale saturates) and keeps the
scaling with the smaller `sum (x̂ - x)^2` (ties: max 6). Its tensor scale maps the amax to
384 * 4 = 1536 instead of 448 * 6 (`g_enc = 1536 / amax(X)`), so that both candidate scales of
the largest tile fit E4M3 (384 and 256), as the method's published kernels do.
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
FOUR_OVER_SIX_TARGET = 384.0 * 4.0  # 4/6's tensor scale target (`_global_target`)
# E2M1 magnitude boundaries between code i and i + 1; a tie goes to the even code.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class FP4Spec:
    """How to quantize one tensor to a 4-bit format: `kind` and tile shape `(rows, cols)`.

    NVFP4 takes tiles (1, 16) (activations, gradients) or (16, 16) (TE's 2-D weight tiles);
    MXFP4 takes (1, 32). Two NVFP4 variants (module doc, "Variants"): `global_scale="row"` gives
    each row (token) its own FP32 second-level scale (1 x 16 tiles only), and `four_over_six`
    scales each tile to 4 or to 6, whichever quantizes it with the smaller squared error.
    """

    kind: FP4Kind = "nvfp4"
    tile: tuple[int, int] = (1, 16)
    global_scale: Literal["tensor", "row"] = "tensor"
    four_over_six: bool = False

    def __post_init__(self) -> None:
        allowed = {"nvfp4": ((1, 16), (16, 16)), "mxfp4": ((1, 32),)}
        if self.kind not in allowed:
            raise ValueError(f"unknown 4-bit format {self.kind!r}: use 'nvfp4' or 'mxfp4'")
        if tuple(self.tile) not in allowed[self.kind]:
            raise ValueError(
                f"{self.kind} tiles are {' or '.join(map(str, allowed[self.kind]))}, got {self.tile}"
            )
        variant = self.global_scale != "tensor" or self.four_over_six
        if variant and self.kind != "nvfp4":
            raise ValueError("per-row global scales and 4/6 block scaling are NVFP4 variants")
        if self.global_scale == "row" and tuple(self.tile) != (1, 16):
            raise ValueError("a per-row global scale needs 1 x 16 tiles (one tile row per row)")

    @property
    def granularity(self) -> str:
        """A name for logs and layer reprs, e.g. `nvfp4-16x16`, `nvfp4-1x16-row-4over6`."""
        name = f"{self.kind}-{self.tile[0]}x{self.tile[1]}"
        return (
            name
            + ("-row" if self.global_scale == "row" else "")
            + ("-4over6" if self.four_over_six else "")
        )


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


def _global_target(spec: FP4Spec) -> float:
    """What the tensor's amax maps to in `g_enc = target / amax`: TE's 448 * 6, or for 4/6
    384 * 4 = 1536, so that the largest tile's scale stays in E4M3 with either candidate (384
    when it maps to 4, 256 when it maps to 6), as the method's published kernels do."""
    return FOUR_OVER_SIX_TARGET if spec.four_over_six else E4M3_MAX * E2M1_MAX


def _nvfp4_scales(
    amax: torch.Tensor,
    global_amax: torch.Tensor,
    block_max: float = E2M1_MAX,
    target: float = E4M3_MAX * E2M1_MAX,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 block scales, FP32 encode multipliers, FP32 global decode scale): formula above,
    with the tile's amax mapped to `block_max` (6, or 4 for 4/6's alternative) and the tensor's
    to `target` (`_global_target`)."""
    f32 = torch.float32
    g_enc = torch.tensor(target, dtype=f32) / global_amax.to(f32)
    g_enc = torch.clamp(g_enc, max=FLT_MAX)
    g_enc = torch.where(g_enc == 0, torch.ones_like(g_enc), g_enc)
    g_dec = torch.tensor(1.0, dtype=f32) / g_enc
    mult = g_enc * torch.reciprocal(torch.tensor(block_max, dtype=f32))
    s = torch.clamp(amax * mult, max=FLT_MAX).clamp(-E4M3_MAX, E4M3_MAX)
    s = s.to(torch.float8_e4m3fn)
    enc = torch.clamp(torch.tensor(1.0, dtype=f32) / (s.to(f32) * g_dec), max=FLT_MAX)
    return s, enc, g_dec


def _nvfp4_tiles(
    tiles: torch.Tensor, amax: torch.Tensor, global_amax: torch.Tensor, four_over_six: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes `(Mb, rows, Kb, cols)`, e4m3 scales `(Mb, Kb)`) of NVFP4 tiles; with
    `four_over_six` each tile keeps whichever of the max-6 and max-4 scalings gives the smaller
    sum of squared errors `sum (x̂ - x)^2` (ties: max 6)."""
    out = []
    target = FOUR_OVER_SIX_TARGET if four_over_six else E4M3_MAX * E2M1_MAX
    for block_max in (E2M1_MAX, 4.0) if four_over_six else (E2M1_MAX,):
        s, enc, g_dec = _nvfp4_scales(amax, global_amax, block_max, target)
        codes = e2m1_codes(torch.clamp(tiles * enc[:, None, :, None], -E2M1_MAX, E2M1_MAX))
        deq = e2m1_values(codes) * (s.to(torch.float32) * g_dec)[:, None, :, None]
        out.append((codes, s, ((deq - tiles) ** 2).sum(dim=(1, 3))))
    if len(out) == 1:
        return out[0][0], out[0][1]
    (c6, s6, e6), (c4, s4, e4) = out
    four = e4 < e6
    codes = torch.where(four[:, None, :, None], c4, c6)
    scales = torch.where(four, s4.to(torch.float32), s6.to(torch.float32))
    return codes, scales.to(torch.float8_e4m3fn)


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
        if spec.global_scale == "row":
            global_amax = x2d.abs().amax(dim=1, keepdim=True).to(torch.float32)
        else:
            global_amax = x2d.abs().amax().to(torch.float32) if x2d.numel() else torch.zeros(())
        codes, scales = _nvfp4_tiles(tiles, amax, global_amax, spec.four_over_six)
    else:
        global_amax = None
        scales = _mxfp4_scales(amax)
        enc = torch.tensor(1.0, dtype=torch.float32) / scales
        codes = e2m1_codes(torch.clamp(tiles * enc[:, None, :, None], -E2M1_MAX, E2M1_MAX))
    m, k = x2d.shape
    codes = codes.reshape(tiles.shape[0] * rows, -1)[:m, :k].reshape(x.shape)
    return FP4Tensor(codes, scales, global_amax, spec)


def decode_scales(t: FP4Tensor) -> torch.Tensor:
    """Per-tile FP32 dequantization multipliers: NVFP4 `fp32(s) * g_dec`, MXFP4 `s`."""
    if t.spec.kind == "mxfp4":
        return t.scales
    _, _, g_dec = _nvfp4_scales(torch.zeros(1), t.global_amax, target=_global_target(t.spec))
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
