"""The Triton block-quantization kernel: its arithmetic on CPU (Triton interpreter) and the
full bit-exact result on a GPU (`gpu` marker)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.fp8.quantize import quantize_tiles

pytest.importorskip("triton", reason="triton is not installed")

SPECS = ["blockwise", "blockwise_pow2", "rowwise", "rowwise_pow2", "e5m2_rowwise"]

_INTERPRETED = textwrap.dedent(
    """
    import torch
    from nemo_fp8_rl.fp8 import FP8Spec, cast_to_fp8
    from nemo_fp8_rl.fp8.quantize import quantize_tiles
    from nemo_fp8_rl.fp8.triton_quant import launch_quantize_kernel
    torch.manual_seed(0)
    x = (torch.randn(300, 260) * torch.logspace(-12, 12, 260)).to(torch.bfloat16)
    x[:128, :128] = 0
    x[200, 5] = 1e-40
    for name in {specs!r}:
        spec = FP8Spec.preset(name)
        y, s = launch_quantize_kernel(x, spec, torch.float32)
        q_ref, s_ref = quantize_tiles(x, spec)
        assert torch.equal(s, s_ref), name
        q = cast_to_fp8(y, spec.format)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), name
    bad = torch.randn(256, 256)
    bad[3, 3] = float("nan")
    assert launch_quantize_kernel(bad, FP8Spec(), torch.float32) is None
    print("interpreted kernel ok")
    """
)


def test_kernel_arithmetic_in_the_triton_interpreter() -> None:
    """Scales exactly, and the pre-cast scaled values cast by torch give the reference codes.
    (The interpreter's own float8 conversion is not RTNE, so the cast itself is GPU-tested.)"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = _INTERPRETED.format(specs=SPECS)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "interpreted kernel ok" in out.stdout


def _gpu_inputs() -> list[torch.Tensor]:
    """Llama-shaped BF16, plus odd shapes with a wide dynamic range and zero tiles per dtype."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rand = torch.randn(4096, 14336, device="cuda", generator=g).to(torch.bfloat16)
    odd = torch.randn(300, 260, device="cuda", generator=g)
    wide = odd * torch.logspace(-12, 12, 260, device="cuda")
    wide[:128, :128] = 0
    half = odd * torch.logspace(-3, 3, 260, device="cuda")  # stays finite in float16
    return [rand, wide.to(torch.bfloat16), wide, half.half(), rand[:, :1000]]  # last: strided


@pytest.mark.gpu
@pytest.mark.parametrize("name", SPECS)
def test_triton_bit_exact_with_reference_on_gpu(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from nemo_fp8_rl.fp8.triton_quant import quantize_blockwise_triton

    spec = FP8Spec.preset(name)
    for x in _gpu_inputs():
        q, s = quantize_blockwise_triton(x, spec)
        q_ref, s_ref = quantize_tiles(x.cpu(), spec)  # the CPU reference path
        assert torch.equal(s.cpu(), s_ref)
        assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.gpu
def test_quantize_on_gpu_uses_kernel_and_falls_back_for_nan() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from nemo_fp8_rl.fp8 import NonFiniteTensorError, quantize

    x = torch.randn(512, 512, device="cuda")
    q, s = quantize(x, FP8Spec.preset("blockwise"))
    assert q.is_cuda and s.shape == (4, 4)
    x[1, 2] = float("inf")
    with pytest.raises(NonFiniteTensorError):
        quantize(x, FP8Spec.preset("blockwise"), name="w")
