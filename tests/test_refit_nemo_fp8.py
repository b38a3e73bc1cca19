"""Trainer-side FP8 refit for NeMo RL without NeMo RL: the quantizer's rules on hand-computed
values, the fast paths against the reference path, and which weights travel as FP8.

The comparison with NeMo RL's own `cast_tensor_to_fp8_blockwise` is in
tests/test_nemo_refit_quant.py (contract suite, both vendored snapshots).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.refit.hf_shapes import (
    hf_weight_shapes,
    layer_shapes,
    recipe_model_config,
)
from nemo_fp8_rl.refit.nemo_fp8 import (
    NemoFp8Layout,
    NemoFp8Rules,
    expand_grouped_experts,
    fp8_weight_names,
    is_fp8_weight,
)
from nemo_fp8_rl.refit.nemo_quant import (
    quantize_blockwise_like_nemo_rl,
    quantize_chunked,
    quantize_reference,
)

# per recipe model: parameter count, FP8 weights per decoder layer
MODELS = {
    "llama-3.1-8b": (8_030_261_248, 7),
    "qwen3-8b": (8_190_735_360, 7),
    "qwen3-4b": (4_022_468_096, 7),
    "qwen3-30b-a3b": (30_532_122_624, 4 + 1 + 3 * 128),
}


def config(model: str) -> dict:
    return recipe_model_config(model)


def bits(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return pair[0].view(torch.uint8), pair[1].view(torch.int32)


def assert_same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]):
    assert a[0].dtype == b[0].dtype == torch.float8_e4m3fn and a[1].dtype == b[1].dtype
    assert torch.equal(bits(a)[0], bits(b)[0]) and torch.equal(bits(a)[1], bits(b)[1])


# -- the quantizer's rules, on values worked out by hand ---------------------------------------


def test_a_dim_that_is_not_whole_blocks_is_padded_with_the_last_element() -> None:
    """Blocks that reach into the padding take |x[-1, -1]| into their amax; zero padding would
    leave them at 0.01."""
    x = torch.full((130, 200), 0.01, dtype=torch.bfloat16)
    x[-1, -1] = 2.0  # block (1, 1)
    _, scale_inv = quantize_blockwise_like_nemo_rl(x, pow2_scale=False)
    amax_01 = torch.tensor(0.01, dtype=torch.bfloat16).float()
    expected_small = torch.reciprocal(torch.reciprocal(amax_01) * 448)
    expected_last = torch.reciprocal(torch.tensor(0.5) * 448)  # amax 2 -> scale 224
    assert scale_inv.shape == (2, 2) and scale_inv.dtype == torch.float32
    assert scale_inv[0, 0] == expected_small
    assert scale_inv[0, 1] == scale_inv[1, 0] == scale_inv[1, 1] == expected_last


def test_scales_follow_nemo_rl_rules_for_ordinary_zero_inf_and_tiny_blocks() -> None:
    x = torch.zeros(128, 5 * 128)
    x[0, 0], x[1, 1] = 1.0, -0.25  # block 0: amax 1
    x[0, 256], x[5, 300] = float("inf"), 3.0  # block 2: amax inf
    x[0, 384] = 1e-38  # block 3: amax below 448 / FLT_MAX -> scale inf
    x[0, 512] = 0.5  # block 4: amax 0.5
    q, s = quantize_blockwise_like_nemo_rl(x, pow2_scale=False)
    assert s[0].tolist() == [
        pytest.approx(1 / 448, rel=1e-7),
        1.0,  # zero block: scale 1
        1.0,  # inf block: scale 1, inf saturates, the rest unscaled
        0.0,  # scale inf: scale_inv 0
        pytest.approx(1 / 896, rel=1e-7),
    ]
    qf = q.float()
    assert qf[0, 0] == 448 and qf[1, 1] == -112 and qf[0, 256] == 448 and qf[5, 300] == 3.0
    assert qf[0, 384] == 448 and torch.isnan(qf[1, 384])  # 0 * inf = NaN, as NeMo RL has it
    q2, s2 = quantize_blockwise_like_nemo_rl(x, pow2_scale=True)
    # pow2: scale_inv = 2^ceil(log2(amax / 448)); zero block: e = 0, scale 1; inf block: 2^127
    assert s2[0, 0] == 2.0**-8 and s2[0, 1] == 1.0 and s2[0, 2] == 2.0**127
    assert s2[0, 3] == 1.0 and s2[0, 4] == 2.0**-9  # tiny: exponent clamps to -127, e = 0 -> 1
    assert q2.float()[0, 0] == 256 and q2.float()[0, 256] == 448 and q2.float()[5, 300] == 0


def test_nan_poisons_its_block_without_pow2() -> None:
    x = torch.ones(256, 128)
    x[130, 7] = float("nan")
    q, s = quantize_blockwise_like_nemo_rl(x, pow2_scale=False)
    assert torch.isnan(s[1, 0]) and torch.isnan(q[128:].float()).all()
    assert (
        s[0, 0] == torch.reciprocal(torch.tensor(448.0)) and not torch.isnan(q[:128].float()).any()
    )


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2-D"):
        quantize_blockwise_like_nemo_rl(torch.ones(4, 4, 4), pow2_scale=False)
    with pytest.raises(TypeError, match="float32/bfloat16/float16"):
        quantize_blockwise_like_nemo_rl(torch.ones(4, 4, dtype=torch.int32), pow2_scale=False)
    with pytest.raises(ValueError, match="square"):
        quantize_blockwise_like_nemo_rl(torch.ones(4, 4), block=(128, 64), pow2_scale=False)


# -- fast paths against the reference path ------------------------------------------------------

SPECIALS = [0.0, -0.0, 1e-40, -3e-39, 1.2e-38, 3e38, -3e38, 1e-20, 65504.0]


@st.composite
def aligned_weights(draw) -> torch.Tensor:
    m, n = draw(st.integers(1, 2)) * 128, draw(st.integers(1, 3)) * 128
    seed = draw(st.integers(0, 2**31 - 1))
    exponent = draw(st.integers(-40, 38))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * 10.0**exponent
    for _ in range(draw(st.integers(0, 6))):
        x[draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))] = draw(
            st.sampled_from(SPECIALS)
        )
    if draw(st.booleans()):
        x[:128, :128] = 0.0
    x = x.to(dtype)
    return x if torch.isfinite(x).all() else torch.nan_to_num(x, posinf=1.0, neginf=-1.0)


@settings(max_examples=30, deadline=None)
@given(aligned_weights(), st.booleans())
def test_the_chunked_cpu_path_equals_the_reference_path(x: torch.Tensor, pow2: bool) -> None:
    fast = quantize_chunked(x, 128, pow2)
    assert fast is not None
    assert_same(fast, quantize_reference(x, 128, pow2))


def test_chunk_boundaries_and_fallbacks() -> None:
    g = torch.Generator().manual_seed(1)
    tall = (torch.randn(8192 + 256, 128, generator=g) * 0.02).to(torch.bfloat16)  # two chunks
    assert_same(quantize_chunked(tall, 128, True), quantize_reference(tall, 128, True))
    assert quantize_chunked(torch.ones(130, 128), 128, False) is None  # padded: reference
    inf = torch.ones(128, 128, dtype=torch.bfloat16)
    inf[3, 3] = float("inf")
    assert quantize_chunked(inf, 128, False) is None
    assert_same(
        quantize_blockwise_like_nemo_rl(inf, pow2_scale=False), quantize_reference(inf, 128, False)
    )


_INTERPRETED = textwrap.dedent(
    """
    import torch
    from nemo_fp8_rl.refit.nemo_quant import quantize_reference
    from nemo_fp8_rl.refit.nemo_quant_triton import quantize_triton
    torch.manual_seed(0)
    for shape in [(130, 260)]:
        x = (torch.randn(*shape) * torch.logspace(-12, 12, shape[1])).to(torch.bfloat16)
        x[:128, :128] = 0
        x[-1, -1] = 5.0
        for pow2 in (False, True):
            y, s = quantize_triton(x, 128, pow2, torch.float32)
            q_ref, s_ref = quantize_reference(x, 128, pow2)
            assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32)), (shape, pow2)
            q = y.to(torch.float8_e4m3fn)
            assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), (shape, pow2)
    bad = torch.randn(256, 256)
    bad[3, 3] = float("nan")
    assert quantize_triton(bad, 128, False, torch.float32) is None
    tiny = torch.full((128, 128), 1e-39)
    assert quantize_triton(tiny, 128, False, torch.float32) is None  # scale inf: reference path
    print("interpreted kernel ok")
    """
)


def test_triton_kernel_arithmetic_in_the_interpreter() -> None:
    """Scales exactly, and the pre-cast values cast by torch give the reference codes (the
    interpreter's float8 conversion is not RTNE; the cast itself is GPU-tested)."""
    pytest.importorskip("triton", reason="triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "interpreted kernel ok" in out.stdout


# -- which weights travel as FP8 ----------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_shapes_from_config_and_fp8_names_per_layer(model: str) -> None:
    cfg = config(model)
    params, fp8_per_layer = MODELS[model]
    shapes = dict(hf_weight_shapes(cfg))
    assert sum(math.prod(s) for s in shapes.values()) == params  # the published size
    layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=cfg["num_hidden_layers"]))
    assert len(layout.fp8_names) == fp8_per_layer * cfg["num_hidden_layers"]
    for name in shapes:
        bf16 = name.endswith(("norm.weight", "bias")) or not name.startswith("model.layers.")
        assert layout.is_fp8(name) != bf16, name


def test_first_last_layers_and_keywords_stay_bf16() -> None:
    cfg = config("qwen3-30b-a3b")
    names = [n for n, _ in hf_weight_shapes(cfg, layers=[0, 1, 46, 47], top_level=False)]
    rules = NemoFp8Rules(num_layers=48, first_bf16=1, last_bf16=1, ignored_keywords=("mlp.gate",))
    fp8 = fp8_weight_names(names, rules)
    assert not any(n.startswith(("model.layers.0.", "model.layers.47.")) for n in fp8)
    assert "model.layers.1.mlp.gate.weight" not in fp8  # keyword
    assert "model.layers.1.mlp.experts.5.gate_proj.weight" in fp8  # 'mlp.gate' not in it
    assert "model.layers.46.self_attn.o_proj.weight" in fp8
    one_expert = NemoFp8Rules(num_layers=48, ignored_keywords=("experts.3.down",))
    # vLLM skips a layer's whole fused-MoE when any ignored entry names its experts
    assert not any("layers.1.mlp.experts" in n for n in fp8_weight_names(names, one_expert))
    assert "model.layers.46.mlp.experts.0.up_proj.weight" not in fp8_weight_names(names, one_expert)
    assert not is_fp8_weight("model.layers.0.mlp.gate.weight", NemoFp8Rules(48, router_fp8=False))


def test_refusals() -> None:
    names = list(layer_shapes(config("qwen3-8b"), 0))
    with pytest.raises(UserError, match="some but not all shards of model.layers.0.self_attn.qkv"):
        NemoFp8Layout(names, NemoFp8Rules(num_layers=36, ignored_keywords=("q_proj",)))
    with pytest.raises(
        UserError, match="cannot tell whether vLLM holds 'model.layers.0.foo.weight'"
    ):
        NemoFp8Layout(["model.layers.0.foo.weight"], NemoFp8Rules(num_layers=36))
    with pytest.raises(UserError, match="precision"):
        NemoFp8Rules.from_vllm_cfg({"precision": "bfloat16"}, 36)
    with pytest.raises(UserError, match="does not read is_mx"):
        NemoFp8Rules.from_vllm_cfg({"precision": "fp8", "is_mx": True}, 36, reads_is_mx=False)
    assert NemoFp8Rules.from_vllm_cfg({"precision": "fp8", "is_mx": True}, 36).mx
    rules = NemoFp8Rules.from_vllm_cfg(
        {"precision": "fp8", "pow2_weight_scaling_factors": True, "num_last_layers_in_bf16": 2}, 36
    )
    assert rules == NemoFp8Rules(num_layers=36, pow2=True, last_bf16=2)
    with pytest.raises(UserError, match="num_last_layers_in_bf16.*nested list"):
        NemoFp8Rules.from_vllm_cfg(
            {"precision": "fp8", "num_last_layers_in_bf16": 2}, 36, bf16_layer_ranges_apply=False
        )


def test_quantize_named_pairs_pass_through_and_planned_metadata() -> None:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.layers.1.self_attn.q_proj.weight": (256, 384),
        "model.layers.1.input_layernorm.weight": (384,),
        "model.layers.1.self_attn.k_scale": (),
        "model.layers.1.mlp.experts.gate_up_proj": (2, 512, 384),
        "model.layers.1.mlp.experts.down_proj": (2, 384, 256),
    }
    layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=4, pow2=True))
    for name, shape in shapes.items():
        tensor = torch.randn(shape, generator=g).to(torch.bfloat16)
        entries = layout.quantize_named(name, tensor)
        planned = layout.planned(name, shape, torch.bfloat16)
        assert [(n, tuple(t.shape), t.dtype) for n, t in entries] == planned
        if name.endswith(("norm.weight", "k_scale")):
            assert entries == [(name, tensor)] and entries[0][1] is tensor
    q_entries = layout.quantize_named(
        "model.layers.1.self_attn.q_proj.weight", tensor := torch.ones(256, 384)
    )
    assert [n for n, _ in q_entries] == [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.q_proj.weight_scale_inv",
    ]
    del tensor
    slab = torch.randn(2, 512, 384, generator=g).to(torch.bfloat16)
    names = [
        n
        for n, _ in expand_grouped_experts(
            "model.layers.1.mlp.experts.gate_up_proj", slab, pow2=False
        )
    ]
    assert (
        names[:4]
        == [
            "model.layers.1.mlp.experts.0.gate_proj.weight",
            "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv",
            "model.layers.1.mlp.experts.1.gate_proj.weight",
            "model.layers.1.mlp.experts.1.gate_proj.weight_scale_inv",
        ]
        and names[4] == "model.layers.1.mlp.experts.0.up_proj.weight"
    )
    v070 = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=4, expand_grouped_experts=False))
    assert v070.quantize_named("model.layers.1.mlp.experts.down_proj", slab)[0][1] is slab
    with pytest.raises(UserError, match="whole number of 128x128 blocks"):
        expand_grouped_experts(
            "model.layers.1.mlp.experts.down_proj", torch.ones(2, 100, 128), pow2=False
        )
