"""The trainer-side MXFP8 quantizer (`refit.nemo_mxfp8`) and the MXFP8 refit layout, on CPU.

Against an independent reference of the rule its docstring states (numpy, exact exponent from
`math.frexp`, E4M3 rounding by enumerating the format's values: `test_fp8_ref`), its fast path
against its plain torch path, and against Transformer Engine's MXFP8 rule (the project's
`FP8Spec.preset("mxfp8")`, held against TE in test_fp8_quantize) where the two rules agree.
Bit-exactness with vLLM's own `mxfp8_e4m3_quantize` and NeMo RL's `quantize_mxfp8_weight`:
tests/test_refit_mxfp8_vllm.py (the vLLM environment).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_fp8_ref import round_array

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.fp8 import FP8Spec, quantize
from nemo_fp8_rl.refit import nemo_mxfp8 as mx
from nemo_fp8_rl.refit.hf_shapes import RECIPE_MODELS, layer_shapes, recipe_model_config
from nemo_fp8_rl.refit.nemo_fp8 import MX_SCALE_SUFFIX, NemoFp8Layout, NemoFp8Rules
from nemo_fp8_rl.refit.wire_bytes import wire_bytes

FOUR = ("llama-3.1-8b", "qwen3-8b", "qwen3-4b", "qwen3-30b-a3b")


def ref_mx(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The documented rule, written independently: codes as float64 values, bytes as uint8."""
    k = x.shape[-1]
    blocks = x.to(torch.float32).numpy().astype(np.float64).reshape(-1, k // 32, 32)
    amax = np.maximum(np.abs(blocks).max(axis=-1), 2.0**-126)
    ebytes = np.empty(amax.shape, dtype=np.int64)
    for idx, a in np.ndenumerate(amax):
        v = float(np.float32(np.float32(a) / np.float32(448.0)))  # vLLM's FP32 division
        mant, ex = math.frexp(v)  # v = mant * 2^ex, mant in [0.5, 1)
        ceil_log2 = ex - 1 if mant == 0.5 else ex
        ebytes[idx] = min(max(ceil_log2 + 127, 0), 254)
    scaled = blocks / np.exp2(ebytes.astype(np.float64) - 127)[..., None]
    codes = round_array(scaled, "e4m3").reshape(x.shape)
    return codes, ebytes.astype(np.uint8).reshape(*x.shape[:-1], k // 32)


def assert_matches_reference(x: torch.Tensor) -> None:
    q, s = mx.mxfp8_quantize_like_vllm(x)
    codes, ebytes = ref_mx(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8
    np.testing.assert_array_equal(s.numpy(), ebytes)
    np.testing.assert_array_equal(q.to(torch.float64).numpy(), codes)


def _distinct_shapes() -> list[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for model in FOUR:
        cfg = recipe_model_config(model)
        shapes = layer_shapes(cfg, 0)
        layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=cfg["num_hidden_layers"], mx=True))
        out |= {shapes[n] for n in layout.fp8_names}
    return sorted(out)


SHAPES = _distinct_shapes()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_fp8_weight_shape_of_the_four_models_follows_the_rule(shape) -> None:
    """Rows 0..63 of each real shape (every K, the rule is per row) against the reference."""
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    rows = min(shape[0], 64)
    std = torch.logspace(-4, 0, rows)[:, None]
    x = (torch.randn(rows, shape[1], generator=gen) * std).to(torch.bfloat16)
    assert_matches_reference(x)


def _edge_tensor() -> torch.Tensor:
    """One 1 x 32 block per row: zeros, BF16 subnormals, +-BF16 max, +-448, 448 * 2^k exactly,
    powers of two, tiny normals, a single non-zero, mixed signs and magnitudes."""
    bmax = float(torch.finfo(torch.bfloat16).max)
    sub = float(torch.finfo(torch.bfloat16).tiny) / 4  # a BF16 subnormal
    rows = [
        [0.0] * 32,
        [-0.0] * 32,
        [sub] * 16 + [-sub / 2] * 16,
        [bmax] + [1.0] * 31,
        [-bmax] + [-1e30] * 31,
        [448.0, -448.0] * 16,
        [448.0 * 2.0**-20] + [3.0 * 2.0**-30] * 31,
        [1.75 * 2.0**-100] * 32,
        [2.0**k for k in range(-16, 16)],
        [2.0**-118] * 32,
        [2.0**-119, 2.0**-125] * 16,
        [0.0] * 31 + [1e-3],
        [(-1.0) ** i * 10.0 ** (i % 7 - 3) for i in range(32)],
    ]
    return torch.tensor(rows, dtype=torch.float32).to(torch.bfloat16)


def test_edge_blocks_follow_the_rule_and_zero_bytes_become_one() -> None:
    x = _edge_tensor()
    assert_matches_reference(x)
    q, s = mx.mxfp8_quantize_like_vllm(x)
    nq, ns = mx.quantize_mxfp8_like_nemo_rl(x)
    assert torch.equal(nq.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(ns, torch.where(s == 0, torch.ones_like(s), s))
    assert s[0].item() == 0 and ns[0].item() == 1  # an all-zero block: NeMo RL writes byte 1
    assert s[5].item() == 127 and q[5, 0].item() == 448.0  # 448 is its own scale's max
    # a block below 448 * 2^-127 keeps byte 0 on vLLM's CPU path: NeMo RL's 1 doubles its values
    assert s[9].item() == 1 and s[10].item() == 0 and ns[10].item() == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("chunk", [96, 1 << 20])
def test_fast_path_equals_plain_torch_path(dtype, chunk, monkeypatch) -> None:
    monkeypatch.setattr(mx, "_CHUNK_ELEMS", chunk)  # 96: a chunk of 1 row, many chunks
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 40, 64, generator=gen) * torch.logspace(-6, 4, 40)[:, None]).to(dtype)
    fast = mx._quantize_chunked(x)
    assert fast is not None
    ref = mx.reference_quantize(x)
    assert fast[1].shape == (3, 40, 2)
    assert torch.equal(fast[0].view(torch.uint8), ref[0].view(torch.uint8))
    assert torch.equal(fast[1], ref[1])


def test_fp32_inputs_just_above_a_power_of_two_use_vllms_log2() -> None:
    """448 * 2^k * (1 + 2^-23): FP32 amax / 448 rounds to one ulp above 2^k, where torch's
    log2 may land on k; the fast path runs vLLM's own scale operations, so it agrees."""
    rows = [[448.0 * 2.0**k * (1 + 2.0**-23)] + [1.0 * 2.0**k] * 31 for k in range(-20, 20)]
    x = torch.tensor(rows, dtype=torch.float32)
    fast, ref = mx._quantize_chunked(x), mx.reference_quantize(x)
    assert torch.equal(fast[1], ref[1])
    assert torch.equal(fast[0].view(torch.uint8), ref[0].view(torch.uint8))


def test_nan_and_bad_shapes_are_refused_and_inf_is_quantized_as_vllm_does() -> None:
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[1, 40] = float("nan")
    with pytest.raises(mx.MxQuantizeError, match="w: holds NaN"):
        mx.quantize_mxfp8_like_nemo_rl(x, what="w")
    with pytest.raises(mx.MxQuantizeError, match="multiple of 32"):
        mx.quantize_mxfp8_like_nemo_rl(torch.ones(4, 48))
    with pytest.raises(mx.MxQuantizeError, match="float32/bfloat16/float16"):
        mx.quantize_mxfp8_like_nemo_rl(torch.ones(4, 32, dtype=torch.float64))
    y = torch.ones(2, 64, dtype=torch.bfloat16)
    y[0, 3] = float("inf")
    q, s = mx.quantize_mxfp8_like_nemo_rl(y)  # the plain torch path, vLLM's: byte 254, and
    assert s[0, 0].item() == 254  # inf / 2^127 cast as torch casts it (its version decides)
    assert torch.equal(q.view(torch.uint8), mx.reference_quantize(y)[0].view(torch.uint8))
    assert s[1].tolist() == [119, 119]  # 1.0: ceil(log2(1/448)) + 127


def test_agrees_with_transformer_engines_mxfp8_rule_on_normal_blocks() -> None:
    """TE's rule (`FP8Spec.preset("mxfp8")`) and vLLM's give the same bytes and codes for every
    block with amax >= 448 * 2^-126 (module docstring); below it they differ, as documented."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(256, 512, generator=gen) * torch.logspace(-30, 30, 256)[:, None]).to(
        torch.bfloat16
    )
    q, s = mx.mxfp8_quantize_like_vllm(x)
    tq, tinv = quantize(x, FP8Spec.preset("mxfp8"))
    te_bytes = (torch.log2(tinv.reshape(s.shape)) + 127).to(torch.uint8)
    assert torch.equal(s, te_bytes)
    assert torch.equal(q.view(torch.uint8), tq.view(torch.uint8))
    tiny = torch.full((1, 32), 2.0**-125, dtype=torch.bfloat16)  # amax < 448 * 2^-127
    vq, vs = mx.mxfp8_quantize_like_vllm(tiny)
    assert vs.item() == 0 and vq[0, 0].item() == 4.0  # vLLM: byte 0, codes x / 2^-127
    tq, tinv = quantize(tiny, FP8Spec.preset("mxfp8"))
    assert tinv.item() == 2.0**-127 and tq[0, 0].item() == 0.0  # TE: byte 0, its scale 1


def test_dequantize_inverts_within_e4m3_precision() -> None:
    """|dequant(quant(x)) − x| ≤ max(2^-4 |x|, 2^-10 · 2^(e − 127)) per element: half an E4M3
    step (3 mantissa bits) for normal codes, half the subnormal step 2^-9 of the block's
    scale 2^(e − 127) (E8M0 byte e) for values that fall below E4M3's normal range."""
    x = torch.randn(64, 256, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    q, s = mx.quantize_mxfp8_like_nemo_rl(x)
    back = mx.dequantize_mxfp8(q, s)
    scale = torch.exp2(s.to(torch.float32) - 127).repeat_interleave(32, dim=1)
    bound = torch.maximum(x.abs() * 2**-4, scale * 2**-10)
    assert ((back - x).abs() <= bound).all()


@pytest.mark.parametrize("model", FOUR)
def test_mx_layout_plans_what_it_sends(model) -> None:
    """Each FP8 weight of one layer travels as E4M3 plus `_scale_from_checkpoint` uint8
    `(m, n/32)`; the planned metadata equals the quantized tensors."""
    cfg = recipe_model_config(model)
    shapes = layer_shapes(cfg, 0)
    rules = NemoFp8Rules.from_vllm_cfg(
        {"precision": "fp8", "is_mx": True}, cfg["num_hidden_layers"]
    )
    assert rules.mx and rules.scale_suffix == MX_SCALE_SUFFIX
    layout = NemoFp8Layout(shapes, rules)
    name = sorted(layout.fp8_names)[0]
    shape = shapes[name]
    weight = torch.randn(shape, dtype=torch.float32).to(torch.bfloat16)
    sent = layout.quantize_named(name, weight)
    planned = layout.planned(name, shape, torch.bfloat16)
    assert [(n, tuple(t.shape), t.dtype) for n, t in sent] == planned
    assert planned[1] == (name + MX_SCALE_SUFFIX, (shape[0], shape[1] // 32), torch.uint8)


def test_mx_refuses_grouped_experts_and_a_nemo_rl_without_is_mx() -> None:
    cfg = recipe_model_config("qwen3-30b-a3b")
    shapes = layer_shapes(cfg, 0, grouped_experts=True)
    layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=48, mx=True))
    slab = next(n for n in shapes if n.endswith("mlp.experts.gate_up_proj"))
    with pytest.raises(UserError, match="does not support grouped MoE expert weights"):
        layout.planned(slab, shapes[slab], torch.bfloat16)
    with pytest.raises(UserError, match="does not read is_mx"):
        NemoFp8Rules.from_vllm_cfg({"precision": "fp8", "is_mx": True}, 48, reads_is_mx=False)


def test_mx_refit_bytes_against_bf16() -> None:
    """E4M3 plus one byte per 32 elements: 0.5156 of BF16 over the FP8 weights of each model."""
    for model in FOUR:
        trainer, generator, fp8_only = wire_bytes(recipe_model_config(model), mx=True)
        assert fp8_only == pytest.approx((1 + 1 / 32) / 2)
        assert trainer < generator
    assert set(FOUR) <= set(RECIPE_MODELS)
