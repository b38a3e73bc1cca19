"""NVFP4 and MXFP4 quantization, bit for bit against Transformer Engine's reference quantizer.

`tests/data/te_fp4_reference.safetensors` holds inputs and the outputs of TE's own reference
functions on them (recorded by `scripts/te_reference_cases.py` from TE d0067d0): packed E2M1
codes, E4M3 / power-of-2 tile scales and the NVFP4 global amax.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nemo_fp8_rl.fp8.fp4 import (
    FP4Spec,
    dequantize_fp4,
    e2m1_codes,
    e2m1_values,
    fake_quantize_fp4,
    pack_fp4x2,
    quantize_fp4,
)

DATA = Path(__file__).parent / "data" / "te_fp4_reference.safetensors"
REF = load_file(str(DATA))
NAMES = sorted({k.split(".")[0] for k in REF})
SPECS = {
    "nvfp4_1x16": FP4Spec("nvfp4", (1, 16)),
    "nvfp4_16x16": FP4Spec("nvfp4", (16, 16)),
    "mxfp4_1x32": FP4Spec("mxfp4", (1, 32)),
}


def test_recorded_from_te_commit() -> None:
    with safe_open(str(DATA), "pt") as f:
        assert f.metadata()["te_commit"].startswith("d0067d0")
    assert len(NAMES) >= 15


@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("name", NAMES)
def test_bit_exact_with_te_reference(name: str, spec_name: str) -> None:
    x = REF[f"{name}.input"]
    spec = SPECS[spec_name]
    ours = quantize_fp4(x, spec)
    key = f"{name}.{spec_name}"
    assert torch.equal(pack_fp4x2(_pad_cols(ours.codes)), REF[f"{key}.data"])
    te_scale = REF[f"{key}.scale"]
    rows, cols = spec.tile
    if spec.kind == "nvfp4":
        te_scale = te_scale[::rows]  # TE repeats a 16 x 16 tile's scale on each of its rows
        mine = ours.scales.view(torch.uint8)
        assert torch.equal(ours.global_amax.reshape(1), REF[f"{key}.global_amax"])
    else:
        mine = ours.scales
    assert torch.equal(mine, te_scale[: mine.shape[0], : mine.shape[1]])


def _pad_cols(codes: torch.Tensor) -> torch.Tensor:
    """TE packs the unpadded columns; an odd column count would need a pad nibble (none here)."""
    assert codes.shape[-1] % 2 == 0
    return codes


def test_e2m1_ties_go_to_the_even_code() -> None:
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 0.26, -0.0])
    expect = [0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 1, 0]
    assert e2m1_codes(y).tolist() == expect


def test_e2m1_nan_gives_code_zero_as_te() -> None:
    assert e2m1_codes(torch.tensor([float("nan")])).tolist() == [0]


def test_dequantize_inverts_exact_grid_values() -> None:
    """A tile whose amax is 6 * 2^k holds E2M1 grid values times 2^k exactly (MXFP4)."""
    x = torch.tensor([[6.0, 4.0, -3.0, 0.5] * 8]) * 0.125
    t = quantize_fp4(x, FP4Spec("mxfp4", (1, 32)))
    assert torch.equal(dequantize_fp4(t), x)


def test_nvfp4_error_is_bounded_by_half_a_step() -> None:
    """Every value lands within half the largest E2M1 step (1.0 of 6) of its tile scale."""
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    t = quantize_fp4(x, FP4Spec("nvfp4", (1, 16)))
    err = (dequantize_fp4(t) - x).abs().view(64, 8, 16).amax(-1)
    tile_amax = x.abs().view(64, 8, 16).amax(-1)
    assert (err <= tile_amax / 6.0 * 1.0 * 1.07).all()  # 1.07: E4M3 rounding of the tile scale


def test_fake_quantize_is_straight_through() -> None:
    x = torch.randn(4, 32, requires_grad=True)
    y = fake_quantize_fp4(x, FP4Spec("nvfp4", (1, 16)))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert torch.equal(y.detach(), dequantize_fp4(quantize_fp4(x.detach(), FP4Spec())))


def test_values_table() -> None:
    assert e2m1_values(torch.arange(16, dtype=torch.uint8)).tolist() == [
        0.0,
        0.5,
        1.0,
        1.5,
        2.0,
        3.0,
        4.0,
        6.0,
        -0.0,
        -0.5,
        -1.0,
        -1.5,
        -2.0,
        -3.0,
        -4.0,
        -6.0,
    ]


def test_bad_spec_is_refused_with_the_allowed_tiles() -> None:
    with pytest.raises(ValueError, match=r"mxfp4 tiles are \(1, 32\)"):
        FP4Spec("mxfp4", (1, 16))
    with pytest.raises(ValueError, match="unknown 4-bit format"):
        FP4Spec("fp4", (1, 16))  # type: ignore[arg-type]
