"""quantize / dequantize / fake_quantize for every `FP8Spec` granularity and scale kind.

The tensor is viewed as `(M, K)` (K = last dim), zero-padded to whole tiles (so partial tiles at
the edges behave as vLLM's `per_block_cast_to_fp8`: padding never raises an amax), and per tile:

    amax = max |x|,  (scale, scale_inv) = scales_for(amax)        (TE's rules, see `scaling`)
    q    = RTNE(clamp(fp32(x) * scale, -fp8_max, fp8_max))        (saturating cast)
    x̂    = q * scale_inv                                            (dequantize)

`scales_for` is TE's `compute_scale_from_amax` for the fp32/pow2 kinds and TE's E8M0 rule for
MXFP8. On CPU, `quantize` runs the chunked fast path (`fast.py`) and on CUDA the Triton kernel
(`triton_quant.py`) where they apply; both are bit-identical to the tiled path here.

Non-finite inputs: `nonfinite="raise"` (the default; for refit, where a NaN weight must never
reach the engine) raises `NonFiniteTensorError(name, count)`. `nonfinite="saturate"` follows
the GPU kernels: NaN is ignored by the amax (as `fmaxf` does) and stays NaN in the output; an
infinite value makes its tile's amax inf, hence scale 1 (TE), and saturates to ±fp8_max.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from nemo_fp8_rl.fp8.fast import quantize_chunked
from nemo_fp8_rl.fp8.formats import cast_to_fp8, fp8_to_float32
from nemo_fp8_rl.fp8.scaling import scales_for
from nemo_fp8_rl.fp8.spec import FP8Spec

NonFinite = Literal["raise", "saturate"]
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class NonFiniteTensorError(ValueError):
    """A tensor holding NaN/Inf was given to `quantize` with `nonfinite="raise"`."""

    def __init__(self, name: str, count: int, numel: int | None = None) -> None:
        self.name = name
        self.count = count
        of = f" of {numel}" if numel is not None else ""
        super().__init__(
            f"tensor {name!r} has {count}{of} non-finite values (NaN/Inf) and cannot be quantized "
            "to FP8; find where they come from (e.g. a diverged optimizer step), or pass "
            "nonfinite='saturate' to clamp Inf to the FP8 maximum and keep NaN"
        )


def scale_inv_shape(shape: tuple[int, ...] | torch.Size, spec: FP8Spec) -> tuple[int, ...]:
    """Shape of the `scale_inv` that `quantize` returns for a tensor of `shape` under `spec`."""
    shape = tuple(shape)
    if spec.granularity == "tensorwise":
        return ()
    if spec.granularity == "per_channel":
        return (*shape[:-1], 1)
    if spec.granularity in ("rowwise", "mxfp8"):
        return (*shape[:-1], math.ceil(shape[-1] / spec.block_shape(1, shape[-1])[1]))
    return (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))


def _check_shape(shape: tuple[int, ...], spec: FP8Spec, what: str) -> None:
    if spec.granularity == "blockwise" and len(shape) != 2:
        raise ValueError(
            f"{what}: blockwise (128x128) quantization needs a 2-D (out, in) weight, got shape "
            f"{list(shape)}; use granularity='rowwise' for activations of any rank"
        )
    if spec.granularity in ("rowwise", "per_channel", "mxfp8") and len(shape) == 0:
        raise ValueError(
            f"{what}: {spec.granularity} quantization needs at least 1 dim, got a scalar"
        )


def _check_input(x: torch.Tensor, spec: FP8Spec, name: str, nonfinite: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize({name!r}): expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(
            f"quantize({name!r}): dtype {x.dtype} is not supported; pass float32, bfloat16 or "
            "float16 (upcast integer or FP8 tensors first)"
        )
    if nonfinite not in ("raise", "saturate"):
        raise ValueError(
            f"quantize({name!r}): nonfinite must be 'raise' or 'saturate', got {nonfinite!r}"
        )
    _check_shape(tuple(x.shape), spec, f"quantize({name!r})")


def _tiles(x2d: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad `(M, K)` to whole `rows x cols` tiles and view it as `(Mb, rows, Kb, cols)`."""
    m, k = x2d.shape
    mb, kb = math.ceil(m / rows), math.ceil(k / cols)
    if mb * rows != m or kb * cols != k:
        x2d = F.pad(x2d, (0, kb * cols - k, 0, mb * rows - m))
    return x2d.reshape(mb, rows, kb, cols)


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.reshape(-1, x.shape[-1])


def _tile_amax(tiles: torch.Tensor, ignore_nan: bool) -> torch.Tensor:
    mag = tiles.abs()
    if ignore_nan:
        mag = mag.masked_fill(torch.isnan(mag), 0)
    return mag.amax(dim=(1, 3)).to(torch.float32)


def count_nonfinite(x: torch.Tensor) -> int:
    """Number of NaN/Inf elements of `x` (one pass; used to validate refit tensors)."""
    return int(x.numel() - torch.isfinite(x).sum().item())


def quantize(
    x: torch.Tensor,
    spec: FP8Spec,
    *,
    name: str = "tensor",
    nonfinite: NonFinite = "raise",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x` to FP8 per `spec`; return `(q, scale_inv)` with `x ≈ q * scale_inv` per tile.

    Args:
        x: float32/bfloat16/float16 tensor; blockwise needs 2-D `(N, K)`.
        spec: format, granularity and scale kind.
        name: used in error messages (the parameter name for refit).
        nonfinite: "raise" (NonFiniteTensorError on NaN/Inf) or "saturate" (see module doc).

    Returns:
        `q` (float8 dtype of `spec.fmt`, same shape as `x`) and `scale_inv` (float32, shape
        `scale_inv_shape(x.shape, spec)`).

    Raises:
        NonFiniteTensorError: NaN/Inf in `x` with `nonfinite="raise"`.
        TypeError, ValueError: unsupported dtype, wrong rank for the granularity, bad option.
    """
    _check_input(x, spec, name, nonfinite)
    fast = _quantize_fast(x, spec)  # None for non-finite input or cases it does not cover
    if fast is not None:
        return fast
    return quantize_tiles(x, spec, name=name, nonfinite=nonfinite)


def _quantize_fast(x: torch.Tensor, spec: FP8Spec) -> tuple[torch.Tensor, torch.Tensor] | None:
    if x.device.type == "cpu":
        return quantize_chunked(x, spec)
    if x.is_cuda and spec.granularity in ("blockwise", "rowwise") and x.numel():
        try:
            from nemo_fp8_rl.fp8.triton_quant import quantize_blockwise_triton
        except ImportError:  # no triton: the tiled torch path runs on the GPU too
            return None
        return quantize_blockwise_triton(x, spec)
    return None


def quantize_tiles(
    x: torch.Tensor, spec: FP8Spec, *, name: str = "tensor", nonfinite: NonFinite = "raise"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference path of `quantize`: pad to whole tiles, reshape, reduce, scale, cast.

    Handles every shape, device and non-finite case; `quantize` uses it where the chunked CPU
    path does not apply. Same arguments and results as `quantize`.
    """
    fmt = spec.format
    bad = count_nonfinite(x)
    if bad and nonfinite == "raise":
        raise NonFiniteTensorError(name, bad, x.numel())
    x2d = _as_2d(x)
    rows, cols = spec.block_shape(*x2d.shape)
    tiles = _tiles(x2d, rows, cols)
    if x.numel() == 0:
        amax = torch.zeros(tiles.shape[0], tiles.shape[2], dtype=torch.float32, device=x.device)
    else:
        amax = _tile_amax(tiles, ignore_nan=bad > 0)
    scale, scale_inv = scales_for(amax, fmt.max, spec.scale, eps=spec.amax_epsilon)
    q_tiles = cast_to_fp8(tiles.to(torch.float32) * scale[:, None, :, None], fmt)
    m, k = x2d.shape
    q = q_tiles.reshape(tiles.shape[0] * rows, -1)[:m, :k].reshape(x.shape)
    return q, scale_inv.reshape(scale_inv_shape(x.shape, spec))


def dequantize(
    q: torch.Tensor, scale_inv: torch.Tensor, spec: FP8Spec, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Return `q * scale_inv` (each tile times its `scale_inv`, FP32 product) cast to `dtype`."""
    if q.dtype not in _FP8_DTYPES:
        raise TypeError(f"dequantize: q must be float8_e4m3fn or float8_e5m2, got {q.dtype}")
    if q.dtype != spec.format.dtype:
        raise TypeError(
            f"dequantize: q is {q.dtype} but the spec's format {spec.fmt} is {spec.format.dtype}"
        )
    _check_shape(tuple(q.shape), spec, "dequantize")
    expected = scale_inv_shape(q.shape, spec)
    if tuple(scale_inv.shape) != expected:
        raise ValueError(
            f"dequantize: scale_inv has shape {list(scale_inv.shape)} but a {spec.granularity} "
            f"quantization of shape {list(q.shape)} has scale_inv shape {list(expected)}"
        )
    q2d = _as_2d(q)
    rows, cols = spec.block_shape(*q2d.shape)
    tiles = _tiles(fp8_to_float32(q2d), rows, cols)
    s = scale_inv.to(torch.float32).reshape(tiles.shape[0], tiles.shape[2])
    out = (tiles * s[:, None, :, None]).reshape(tiles.shape[0] * rows, -1)
    m, k = q2d.shape
    return out[:m, :k].reshape(q.shape).to(dtype)


class _FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: FP8Spec) -> torch.Tensor:  # noqa: ANN001
        q, scale_inv = quantize(x, spec, nonfinite="saturate")
        return dequantize(q, scale_inv, spec, dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


def fake_quantize(x: torch.Tensor, spec: FP8Spec) -> torch.Tensor:
    """Quantize-dequantize `x` (same dtype and shape), with a straight-through gradient.

    Forward: `dequantize(*quantize(x, spec))`; backward: `dL/dx = dL/dy` (the rounding is
    treated as identity, as FP8 training does for its casts). Non-finite values saturate.
    """
    return _FakeQuantize.apply(x, spec)
