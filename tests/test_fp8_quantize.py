"""Bit-exactness of the FP8 quantizers against the plain per-tile reference in test_fp8_ref."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_fp8_ref import finite_values, ref_quantize, round_array, round_scalar

from nemo_fp8_rl.fp8 import FP8Spec, dequantize, quantize, scale_inv_shape
from nemo_fp8_rl.fp8.fast import quantize_chunked
from nemo_fp8_rl.fp8.quantize import quantize_tiles

GRANULARITIES = ["tensorwise", "per_channel", "rowwise", "blockwise"]
SCALES = ["fp32", "pow2"]


def _check_exact(x: torch.Tensor, spec: FP8Spec) -> None:
    """Every implementation (public dispatch, tiled reference path, chunked CPU path where it
    applies) must equal the plain per-tile reference, codes and scales."""
    ref_q, ref_sinv = ref_quantize(x, spec.fmt, spec.granularity, spec.pow2, spec.amax_epsilon)
    results = [
        quantize(x, spec, nonfinite="saturate"),
        quantize_tiles(x, spec, nonfinite="saturate"),
        quantize_chunked(x, spec),
    ]
    for q, sinv in [r for r in results if r is not None]:
        assert q.dtype == spec.format.dtype and q.shape == x.shape
        assert tuple(sinv.shape) == scale_inv_shape(x.shape, spec)
        np.testing.assert_array_equal(sinv.reshape(ref_sinv.shape).numpy(), ref_sinv)
        np.testing.assert_array_equal(q.to(torch.float64).numpy(), ref_q)


def test_chunked_path_applies_and_falls_back() -> None:
    x = torch.randn(300, 256)
    assert quantize_chunked(x, FP8Spec.preset("blockwise")) is not None
    assert quantize_chunked(torch.randn(300, 250), FP8Spec.preset("rowwise")) is None  # K % 128
    x[5, 7] = float("inf")
    assert quantize_chunked(x, FP8Spec.preset("blockwise")) is None  # non-finite: reference path


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk_elems", [3 * 256, 256 * 256])
def test_chunked_multi_chunk_bit_exact(
    granularity: str, dtype: torch.dtype, chunk_elems: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks force many chunks (and a partial last one, for blockwise a zero-padded
    block-row) through the chunked path; 256 rows per chunk puts two block-rows in one chunk."""
    monkeypatch.setattr("nemo_fp8_rl.fp8.fast._CHUNK_ELEMS", chunk_elems)
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(300, 256, generator=gen) * torch.logspace(-3, 3, 300)[:, None]).to(dtype)
    spec = FP8Spec("e4m3", granularity, "fp32")
    assert quantize_chunked(x, spec) is not None
    _check_exact(x, spec)


def _adversarial(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Tiles mixing huge, tiny, subnormal-producing and zero values, one outlier per 128x128 tile."""
    x = torch.randn(m, k, generator=gen) * torch.logspace(-30, 30, k).clamp(max=1e30)
    x[: min(m, 128), : min(k, 64)] = 0.0  # an all-zero region (whole tiles for rowwise)
    x[1::7, ::5] *= 1e-6  # values that underflow to FP8 subnormals / zero next to normal ones
    for i in range(0, m, 128):
        for j in range(0, k, 128):
            x[i + (i * 7 + 3) % min(128, m - i), j] = 3.0e4  # one outlier per tile
    return x


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_bit_exact(granularity: str, scale: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(256, 384, generator=gen) * 3).to(dtype)
    _check_exact(x, FP8Spec("e4m3", granularity, scale))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (129, 255), (200, 130), (130, 1)])
def test_odd_shapes_bit_exact(granularity: str, scale: str, shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=gen).to(torch.bfloat16)
    _check_exact(x, FP8Spec("e4m3", granularity, scale))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_adversarial_bit_exact(granularity: str, scale: str, fmt: str) -> None:
    gen = torch.Generator().manual_seed(2)
    _check_exact(_adversarial(260, 300, gen), FP8Spec(fmt, granularity, scale))


@pytest.mark.parametrize("scale", SCALES)
def test_extreme_amax_cases(scale: str) -> None:
    """Tiny amax (scale overflows -> FLT_MAX), huge amax, zero tiles, and an amax floor."""
    x = torch.zeros(2, 512)
    x[0, 0:128] = 1e-39  # FP32 subnormal: 448/amax overflows, TE substitutes FLT_MAX
    x[0, 128:256] = torch.linspace(-3e38, 3e38, 128, dtype=torch.float64).float()
    x[1, 0:128] = torch.linspace(-1e-20, 1e-20, 128)
    for eps in (0.0, 1e-12):
        _check_exact(x, FP8Spec("e4m3", "rowwise", scale, amax_epsilon=eps))
    q, sinv = quantize(x, FP8Spec("e4m3", "rowwise", scale))
    assert sinv[1, 1].item() == 1.0  # an all-zero tile has scale_inv 1 (TE)


def test_vllm_scale_shapes() -> None:
    w = torch.randn(300, 520)
    assert quantize(w, FP8Spec.preset("blockwise"))[1].shape == (3, 5)
    assert quantize(w, FP8Spec.preset("rowwise"))[1].shape == (300, 5)
    assert quantize(w, FP8Spec.preset("per_channel"))[1].shape == (300, 1)
    assert quantize(w, FP8Spec.preset("tensorwise"))[1].shape == ()
    assert quantize(torch.randn(2, 3, 130), FP8Spec.preset("rowwise"))[1].shape == (2, 3, 2)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_torch_cast_is_rtne_and_saturating(fmt: str) -> None:
    """Pin the element cast: every midpoint and neighbour of every FP8 value, plus overflow."""
    vals, _ = finite_values(fmt)
    mids = (vals[1:] + vals[:-1]) / 2
    probe = np.concatenate([vals, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    probe = np.concatenate([probe, -probe, [1e9, -1e9, np.inf, -np.inf]]).astype(np.float32)
    spec = FP8Spec(fmt, "tensorwise", "fp32")
    from nemo_fp8_rl.fp8 import cast_to_fp8

    got = cast_to_fp8(torch.from_numpy(probe), spec.format).to(torch.float64).numpy()
    np.testing.assert_array_equal(got, round_array(probe, fmt))
    assert round_scalar(1.0625, "e4m3") == 1.0 and round_scalar(1.1875, "e4m3") == 1.25
    assert got[-2] == spec.format.max and got[-1] == -spec.format.max  # ±inf saturate


def test_nan_kept_and_ignored_by_amax() -> None:
    x = torch.tensor([[1.0, float("nan"), -2.0, 0.5]])
    q, sinv = quantize(x, FP8Spec("e4m3", "tensorwise", "fp32"), nonfinite="saturate")
    assert math.isnan(q[0, 1].float().item())
    assert sinv.item() == np.float32(1.0) / (np.float32(448.0) / np.float32(2.0))
    inf = torch.tensor([[1.0, float("inf"), -3.0, 1000.0]])
    q, sinv = quantize(inf, FP8Spec("e4m3", "tensorwise", "fp32"), nonfinite="saturate")
    assert sinv.item() == 1.0  # amax inf -> scale 1 (TE)
    assert q.float().tolist() == [[1.0, 448.0, -3.0, 448.0]]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("scale", SCALES)
def test_round_trip_error_bound(granularity: str, scale: str) -> None:
    """|x - x̂| <= 2^-4 |x| for values in the normal range (3 mantissa bits, RTNE), and
    <= 2^-10 * scale_inv absolutely (half the subnormal step) below it."""
    spec = FP8Spec("e4m3", granularity, scale)
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(3)) * 10
    q, sinv = quantize(x, spec)
    err = (dequantize(q, sinv, spec) - x).abs()
    s_full = dequantize(torch.ones_like(q), sinv, spec)  # scale_inv broadcast to every element
    normal = x.abs() >= s_full * 2.0**-6  # the scaled input lies in the normal range
    assert (err[normal] <= x.abs()[normal] * 2.0**-4).all()
    assert (err[~normal] <= s_full[~normal] * 2.0**-10 + 0.0).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(256, 384), (7, 45), (3, 5, 96)])
def test_mxfp8_bit_exact(fmt: str, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(*shape, generator=gen) * torch.logspace(-30, 30, shape[-1])).to(torch.bfloat16)
    x.view(-1, shape[-1])[0, :32] = 0  # an all-zero block: E8M0 exponent 0, scale 1
    _check_exact(x, FP8Spec(fmt, "mxfp8", "e8m0"))
    q, s = quantize(x, FP8Spec(fmt, "mxfp8", "e8m0"))
    assert s.shape == (*shape[:-1], -(-shape[-1] // 32))
    e = torch.log2(s)
    assert torch.equal(e, e.round())  # every MXFP8 scale is a power of two


def test_mxfp8_scale_rounds_up() -> None:
    """amax = 448 * 2^j exactly gives scale_inv 2^j; anything above rounds up to 2^(j+1)."""
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 32] = 448.0 * 4, 448.0 * 4 * (1 + 2**-10)
    q, s = quantize(x, FP8Spec.preset("mxfp8"))
    assert s.tolist() == [[4.0, 8.0]]
    assert q[0, 0].float().item() == 448.0 and q[0, 32].float().item() == 224.0
    with pytest.raises(ValueError, match="E8M0"):
        FP8Spec("e4m3", "rowwise", "e8m0")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_to_float32_table_is_exact(dtype: torch.dtype) -> None:
    from nemo_fp8_rl.fp8 import fp8_to_float32

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(4, 64)
    got, want = fp8_to_float32(codes), codes.to(torch.float32)
    assert got.shape == (4, 64) and got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # NaN payloads included
    got_t = fp8_to_float32(codes.t())  # non-contiguous input
    assert torch.equal(got_t.view(torch.int32), want.t().contiguous().view(torch.int32))
