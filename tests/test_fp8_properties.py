"""Property tests (hypothesis) over shapes, dtypes and specs, plus the error contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fp8_ref import ref_quantize

from nemo_fp8_rl.fp8 import (
    FP8Spec,
    NonFiniteTensorError,
    dequantize,
    quantize,
    scale_inv_shape,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
specs = st.builds(
    FP8Spec,
    fmt=st.sampled_from(["e4m3", "e5m2"]),
    granularity=st.sampled_from(["tensorwise", "per_channel", "rowwise", "blockwise"]),
    scale=st.sampled_from(["fp32", "pow2"]),
) | st.builds(
    FP8Spec,
    fmt=st.sampled_from(["e4m3", "e5m2"]),
    granularity=st.just("mxfp8"),
    scale=st.just("e8m0"),
)


@st.composite
def tensors(draw: st.DrawFn, spec: FP8Spec) -> torch.Tensor:
    """A tensor of a drawn shape (2-D for blockwise, 1-3-D otherwise), dtype and magnitude."""
    ndim = 2 if spec.granularity == "blockwise" else draw(st.integers(1, 3))
    dims = [draw(st.integers(1, 3)) for _ in range(ndim - 2)]
    dims += [draw(st.integers(1, 260)) for _ in range(min(ndim, 2))]
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(DTYPES))
    log_mag = draw(st.floats(-10, 10) if dtype == torch.float16 else st.floats(-20, 20))
    x = torch.randn(*dims, generator=torch.Generator().manual_seed(seed)) * 2.0**log_mag
    return x.to(dtype)


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, FP8Spec]:
    spec = draw(specs)
    return draw(tensors(spec)), spec


@settings(max_examples=40, deadline=None)
@given(cases())
def test_shapes_dtypes_and_reference(case: tuple[torch.Tensor, FP8Spec]) -> None:
    x, spec = case
    q, s = quantize(x, spec)
    assert q.shape == x.shape and q.dtype == spec.format.dtype
    assert s.dtype == torch.float32 and tuple(s.shape) == scale_inv_shape(x.shape, spec)
    ref_q, ref_s = ref_quantize(x, spec.fmt, spec.granularity, spec.pow2)
    np.testing.assert_array_equal(q.to(torch.float64).numpy(), ref_q)
    np.testing.assert_array_equal(s.reshape(ref_s.shape).numpy(), ref_s)
    assert dequantize(q, s, spec, dtype=x.dtype).dtype == x.dtype


@settings(max_examples=30, deadline=None)
@given(cases())
def test_sign_symmetry(case: tuple[torch.Tensor, FP8Spec]) -> None:
    x, spec = case
    q, s = quantize(x, spec)
    qn, sn = quantize(-x, spec)
    assert torch.equal(s, sn)
    assert torch.equal(qn.to(torch.float32), -q.to(torch.float32))


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(-6, 6))
def test_power_of_two_rescaling_is_exact(case: tuple[torch.Tensor, FP8Spec], j: int) -> None:
    """x * 2^j gives the same codes and scale_inv * 2^j (division by amax * 2^j is exact)."""
    x, spec = case
    x = x.float()
    q, s = quantize(x, spec)
    q2, s2 = quantize(x * 2.0**j, spec)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(s2, s * 2.0**j)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_round_trip_is_within_half_a_step(case: tuple[torch.Tensor, FP8Spec]) -> None:
    """|x - x̂| <= max(2^-(m+1) |x|, half the smallest subnormal step) in scaled units."""
    x, spec = case
    q, s = quantize(x, spec)
    s_full = dequantize(torch.ones_like(q), s, spec)
    err = (dequantize(q, s, spec) - x.float()).abs() / s_full
    mbits, min_sub = (3, 2.0**-9) if spec.fmt == "e4m3" else (2, 2.0**-16)
    bound = torch.maximum(x.float().abs() / s_full * 2.0 ** -(mbits + 1), torch.tensor(min_sub / 2))
    assert (err <= bound * (1 + 1e-6)).all()


def test_error_messages() -> None:
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.randn(2, 3, 4), FP8Spec.preset("blockwise"), name="w")
    with pytest.raises(TypeError, match="int64.*float32, bfloat16 or float16"):
        quantize(torch.arange(6).reshape(2, 3), FP8Spec.preset("tensorwise"))
    with pytest.raises(ValueError, match="nonfinite"):
        quantize(torch.randn(2, 2), FP8Spec(), nonfinite="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown FP8 granularity"):
        FP8Spec(granularity="block")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown FP8 format"):
        FP8Spec(fmt="e3m4")  # type: ignore[arg-type]
    q, s = quantize(torch.randn(256, 256), FP8Spec.preset("blockwise"))
    with pytest.raises(ValueError, match=r"scale_inv has shape \[2, 3\].*\[2, 2\]"):
        dequantize(q, torch.ones(2, 3), FP8Spec.preset("blockwise"))
    with pytest.raises(TypeError, match="float8_e5m2"):
        dequantize(q, s, FP8Spec("e5m2", "blockwise"))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_raises_with_name_and_count(value: float) -> None:
    w = torch.randn(256, 384, dtype=torch.bfloat16)
    w[3, 5] = value
    w[200, 300] = value
    with pytest.raises(
        NonFiniteTensorError, match=r"'layers.0.mlp.down_proj.weight' has 2 of"
    ) as e:
        quantize(w, FP8Spec.preset("blockwise"), name="layers.0.mlp.down_proj.weight")
    assert e.value.name == "layers.0.mlp.down_proj.weight" and e.value.count == 2
    q, s = quantize(w, FP8Spec.preset("blockwise"), nonfinite="saturate")
    if value != value:
        assert torch.isnan(q[3, 5].float())
    else:
        assert q[3, 5].float().item() == np.sign(value) * 448.0
        assert s[0, 0].item() == 1.0  # TE: an infinite amax gives scale 1
