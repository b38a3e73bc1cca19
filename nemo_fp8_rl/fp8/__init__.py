"""FP8 numerics: formats, scaling, quantize / dequantize / fake-quant, emulation modules.

Bit-exact with Transformer Engine's current/block scaling (scale = fp8_max / amax, optional
power-of-2 rounding) and with vLLM's checkpoint layout (`weight_scale_inv`, ceil(N/128) x
ceil(K/128) for 128x128 blocks, zero-padded partial tiles).
"""

from nemo_fp8_rl.fp8.formats import E4M3, E5M2, FP8Format, cast_to_fp8, fp8_to_float32, get_format
from nemo_fp8_rl.fp8.quantize import (
    NonFiniteTensorError,
    count_nonfinite,
    dequantize,
    fake_quantize,
    quantize,
    scale_inv_shape,
)
from nemo_fp8_rl.fp8.scaling import scale_from_amax
from nemo_fp8_rl.fp8.spec import PRESETS, FP8Spec

__all__ = [
    "E4M3",
    "E5M2",
    "PRESETS",
    "FP8Format",
    "FP8Spec",
    "NonFiniteTensorError",
    "cast_to_fp8",
    "count_nonfinite",
    "dequantize",
    "fake_quantize",
    "fp8_to_float32",
    "get_format",
    "quantize",
    "scale_from_amax",
    "scale_inv_shape",
]
