"""Bit-exact against NeMo RL's own vLLM-side quantizer (`NEMO_RL_SRC`, the contract suite).

NeMo RL's `nemo_rl/models/generation/vllm/quantization/fp8.py` is loaded from the tree with
vLLM stand-ins (`nemo_fp8_rl.refit.nemo_reference`: the vLLM classes the file imports at its
top are minimal named stand-ins; no vLLM code runs), and its real `cast_tensor_to_fp8_blockwise`
(and, on 7ea279a, `_expand_grouped_moe_expert_to_fp8`) is compared with the project's quantizer:
E4M3 codes byte for byte, FP32 `scale_inv` bit for bit (a NaN scale must be NaN in both), on

- every distinct FP8 weight shape of one decoder layer of Llama 3.1 8B, Qwen3-8B, Qwen3-4B and
  Qwen3-30B-A3B (random values at the real shapes), pow2 scales off and on;
- hypothesis-drawn shapes (dims that are not multiples of 128 included) and values (zeros,
  +-inf, NaN, BF16 subnormals, magnitudes from 1e-40 to 3e38, all-zero blocks);
- grouped MoE expert slabs at Qwen3-30B-A3B's per-expert shapes (7ea279a).

Every FP8 tensor of the four models: scripts/refit_bitexact_sweep.py.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_fp8_rl.refit.hf_shapes import RECIPE_MODELS, layer_shapes, recipe_model_config
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules, expand_grouped_experts
from nemo_fp8_rl.refit.nemo_quant import quantize_blockwise_like_nemo_rl
from nemo_fp8_rl.refit.nemo_reference import (
    FP8_FILE,
    load_nemo_rl_fp8,
    nemo_rl_cast,
    nemo_rl_expand_grouped,
)

SRC = os.environ.get("NEMO_RL_SRC")

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(
        not SRC or not (Path(SRC) / FP8_FILE).is_file(),
        reason=f"NEMO_RL_SRC does not name a NeMo RL tree with {FP8_FILE} "
        "(run scripts/nemo-rl-contract.sh /path/to/nemo-rl)",
    ),
]


@pytest.fixture(scope="module")
def nemo():
    torch.set_num_threads(1)
    return load_nemo_rl_fp8(SRC)


def assert_same_bits(ours, theirs) -> None:
    (q1, s1), (q2, s2) = ours, theirs
    assert (q1.dtype, s1.dtype) == (q2.dtype, s2.dtype) == (torch.float8_e4m3fn, torch.float32)
    assert q1.shape == q2.shape and s1.shape == s2.shape
    assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8))
    nan = torch.isnan(s2)
    assert torch.equal(torch.isnan(s1), nan)
    assert torch.equal(s1.view(torch.int32)[~nan], s2.view(torch.int32)[~nan])


def _distinct_layer_shapes() -> list[tuple[str, tuple[int, int]]]:
    seen: dict[tuple[int, int], str] = {}
    for model in RECIPE_MODELS:
        cfg = recipe_model_config(model)
        shapes = layer_shapes(cfg, 0)
        layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=cfg["num_hidden_layers"]))
        for name in sorted(layout.fp8_names):
            seen.setdefault(shapes[name], f"{model}:{name.split('.', 3)[3]}")
    return [(label, shape) for shape, label in seen.items()]


LAYER_SHAPES = _distinct_layer_shapes()


@pytest.mark.parametrize("pow2", [False, True], ids=["fp32-scales", "pow2-scales"])
@pytest.mark.parametrize("label,shape", LAYER_SHAPES, ids=[label for label, _ in LAYER_SHAPES])
def test_real_weight_shapes(nemo, label: str, shape: tuple[int, int], pow2: bool) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(label.encode()))
    weight = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    assert_same_bits(
        quantize_blockwise_like_nemo_rl(weight, pow2_scale=pow2), nemo_rl_cast(nemo, weight, pow2)
    )


SPECIALS = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -9e-41, 3e38, 1e-38]


@st.composite
def weights(draw) -> torch.Tensor:
    m, n = draw(st.integers(1, 300)), draw(st.integers(1, 300))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(m, n, generator=g) * 10.0 ** draw(st.integers(-40, 37))
    for _ in range(draw(st.integers(0, 5))):
        x[draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))] = draw(
            st.sampled_from(SPECIALS)
        )
    if draw(st.booleans()):
        x[: draw(st.integers(1, m)), : draw(st.integers(1, n))] = 0.0
    if draw(st.booleans()):  # the padding value: it reaches every edge block's amax
        x[-1, -1] = x.abs().max() * draw(st.sampled_from([0.5, 2.0, 1e3]))
    return x.to(draw(st.sampled_from([torch.bfloat16, torch.float32, torch.float16])))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights(), st.booleans())
def test_hypothesis_shapes_and_values(nemo, x: torch.Tensor, pow2: bool) -> None:
    assert_same_bits(
        quantize_blockwise_like_nemo_rl(x, pow2_scale=pow2), nemo_rl_cast(nemo, x, pow2)
    )


@pytest.mark.parametrize("pow2", [False, True])
def test_special_blocks_and_last_element_padding(nemo, pow2: bool) -> None:
    x = torch.randn(300, 390) * 0.01
    x[:128, :128] = 0.0  # zero block
    x[0, 200] = float("inf")  # inf block
    x[130:256, :128] = 1e-39  # subnormal block: scale inf without pow2
    x[-1, -1] = 7.0  # padding value for the last block-row and block-column
    for dtype in (torch.float32, torch.bfloat16):
        w = x.to(dtype)
        assert_same_bits(
            quantize_blockwise_like_nemo_rl(w, pow2_scale=pow2), nemo_rl_cast(nemo, w, pow2)
        )


def test_grouped_expert_expansion(nemo) -> None:
    if not hasattr(nemo, "_expand_grouped_moe_expert_to_fp8"):
        pytest.skip("this NeMo RL (v0.7.0) has no grouped-expert expansion: slabs pass as BF16")
    cfg = recipe_model_config("qwen3-30b-a3b")
    hidden, inter, experts = cfg["hidden_size"], cfg["moe_intermediate_size"], 3
    g = torch.Generator().manual_seed(0)
    for key, shape in (
        ("model.layers.5.mlp.experts.gate_up_proj", (experts, 2 * inter, hidden)),
        ("model.layers.5.mlp.experts.down_proj", (experts, hidden, inter)),
    ):
        slab = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        for pow2 in (False, True):
            ours = expand_grouped_experts(key, slab, pow2=pow2)
            theirs = nemo_rl_expand_grouped(nemo, key, slab, pow2)
            assert [n for n, _ in ours] == [n for n, _ in theirs]
            for i in range(0, len(ours), 2):
                assert_same_bits(
                    (ours[i][1], ours[i + 1][1]), (theirs[i][1].contiguous(), theirs[i + 1][1])
                )
