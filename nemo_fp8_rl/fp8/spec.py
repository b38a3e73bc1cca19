"""`FP8Spec`: the value type naming how a tensor is quantized (format, granularity, scale kind).

Granularities (block shapes over the tensor viewed as `(M, K)`, K = last dim, M = the rest):

| granularity | tile | `scale_inv` shape | used by |
|---|---|---|---|
| tensorwise | whole tensor | `()` | TE `Float8CurrentScaling`, vLLM per-tensor |
| per_channel | 1 x K (one per output row) | `(*lead, 1)` | compressed-tensors `strategy: channel` |
| rowwise | 1 x 128 along K | `(*lead, ceil(K/128))` | TE blockwise activations/grads, vLLM `GroupShape(1,128)` |
| blockwise | 128 x 128 (2-D only) | `(ceil(M/128), ceil(K/128))` | TE blockwise weights, vLLM `weight_block_size [128,128]` |
| mxfp8 | 1 x 32 along K | `(*lead, ceil(K/32))` | TE `MXFP8BlockScaling` (E8M0 scales) |

Scale kinds: `fp32` (scale = fp8_max / amax) or `pow2` (that scale rounded down to a power of 2
by zeroing its mantissa, TE's default for `Float8BlockScaling`); `mxfp8` always uses `e8m0`
(a power of two rounded *up* from amax / fp8_max, see `scaling.e8m0_scale_from_amax`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nemo_fp8_rl.fp8.formats import FP8Format, get_format

Granularity = Literal["tensorwise", "per_channel", "rowwise", "blockwise", "mxfp8"]
ScaleKind = Literal["fp32", "pow2", "e8m0"]
BLOCK_LEN = 128
MX_BLOCK_LEN = 32
_GRANULARITIES = ("tensorwise", "per_channel", "rowwise", "blockwise", "mxfp8")
_SCALES = ("fp32", "pow2", "e8m0")


@dataclass(frozen=True)
class FP8Spec:
    """How to quantize one tensor: element format, scaling granularity, scale kind.

    `amax_epsilon` floors each tile's amax before the scale is derived (TE's `amax_epsilon`,
    0.0 in every TE recipe).
    """

    fmt: Literal["e4m3", "e5m2"] = "e4m3"
    granularity: Granularity = "blockwise"
    scale: ScaleKind = "fp32"
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        get_format(self.fmt)
        if self.granularity not in _GRANULARITIES:
            raise ValueError(
                f"unknown FP8 granularity {self.granularity!r}: use one of {list(_GRANULARITIES)}"
            )
        if self.scale not in _SCALES:
            raise ValueError(f"unknown FP8 scale kind {self.scale!r}: use one of {list(_SCALES)}")
        if (self.granularity == "mxfp8") != (self.scale == "e8m0"):
            raise ValueError(
                f"scale={self.scale!r} with granularity={self.granularity!r}: MXFP8 (1x32 blocks) "
                "uses E8M0 scales and E8M0 scales only MXFP8; use FP8Spec.preset('mxfp8')"
            )
        if not self.amax_epsilon >= 0.0:
            raise ValueError(f"amax_epsilon must be >= 0, got {self.amax_epsilon}")

    @property
    def format(self) -> FP8Format:
        """The `FP8Format` (dtype, max) this spec quantizes to."""
        return get_format(self.fmt)

    @property
    def pow2(self) -> bool:
        """True when scales are rounded down to powers of two."""
        return self.scale == "pow2"

    def block_shape(self, m: int, k: int) -> tuple[int, int]:
        """Tile shape `(rows, cols)` over a tensor viewed as `(m, k)` (at least 1 x 1)."""
        if self.granularity == "tensorwise":
            return max(m, 1), max(k, 1)
        if self.granularity == "per_channel":
            return 1, max(k, 1)
        if self.granularity == "rowwise":
            return 1, BLOCK_LEN
        if self.granularity == "mxfp8":
            return 1, MX_BLOCK_LEN
        return BLOCK_LEN, BLOCK_LEN

    @classmethod
    def preset(cls, name: str) -> FP8Spec:
        """A named spec: `blockwise`, `blockwise_pow2`, `tensorwise`, `rowwise`, `rowwise_pow2`,
        `per_channel`, `mxfp8`, `e5m2_rowwise` (gradients in the HYBRID format). All E4M3 with
        FP32 scales unless named."""
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown FP8 preset {name!r}: use one of {sorted(PRESETS)}") from None


PRESETS: dict[str, FP8Spec] = {
    "blockwise": FP8Spec("e4m3", "blockwise", "fp32"),
    "blockwise_pow2": FP8Spec("e4m3", "blockwise", "pow2"),
    "tensorwise": FP8Spec("e4m3", "tensorwise", "fp32"),
    "rowwise": FP8Spec("e4m3", "rowwise", "fp32"),
    "rowwise_pow2": FP8Spec("e4m3", "rowwise", "pow2"),
    "per_channel": FP8Spec("e4m3", "per_channel", "fp32"),
    "e5m2_rowwise": FP8Spec("e5m2", "rowwise", "fp32"),
    "mxfp8": FP8Spec("e4m3", "mxfp8", "e8m0"),
}
