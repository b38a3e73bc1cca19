"""The trainer-side refit layout for the DeepSeek-V3 architecture (DeepSeek-V3, Moonlight): MLA
projection and DeepSeek expert names from the shipped config.json, which of them vLLM holds in
FP8 under NeMo RL's rules and the recipes' `quantization_ignored_layer_kws: [a_proj, b_proj]`."""

from __future__ import annotations

import pytest

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.refit.hf_shapes import hf_weight_shapes, recipe_model_config
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules

KWS = ("a_proj", "b_proj")


def _layer(model: str, layer: int, ignored: tuple[str, ...] = KWS):
    config = recipe_model_config(model)
    shapes = dict(hf_weight_shapes(config, layers=[layer], top_level=False))
    rules = NemoFp8Rules(num_layers=config["num_hidden_layers"], ignored_keywords=ignored)
    return shapes, NemoFp8Layout(shapes, rules)


def _local(names) -> set[str]:
    return {n.split(".", 3)[3] for n in names if ".experts." not in n or ".experts.0." in n}


def test_deepseek_v3_moe_layer_names_shapes_and_fp8_set():
    shapes, layout = _layer("deepseek-v3", 5)
    p = "model.layers.5."
    assert shapes[p + "self_attn.q_a_proj.weight"] == (1536, 7168)
    assert shapes[p + "self_attn.q_b_proj.weight"] == (128 * 192, 1536)
    assert shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] == (512 + 64, 7168)
    assert shapes[p + "self_attn.kv_b_proj.weight"] == (128 * 256, 512)
    assert shapes[p + "self_attn.o_proj.weight"] == (7168, 128 * 128)
    assert shapes[p + "mlp.experts.255.down_proj.weight"] == (7168, 2048)
    assert shapes[p + "mlp.shared_experts.gate_proj.weight"] == (2048, 7168)
    assert _local(layout.fp8_names) == {
        "self_attn.o_proj.weight",
        "mlp.experts.0.gate_proj.weight",
        "mlp.experts.0.up_proj.weight",
        "mlp.experts.0.down_proj.weight",
        "mlp.shared_experts.gate_proj.weight",
        "mlp.shared_experts.up_proj.weight",
        "mlp.shared_experts.down_proj.weight",
    }
    assert len(layout.fp8_names) == 256 * 3 + 3 + 1
    # vLLM's DeepSeek MoE router is unquantized; the score bias and norms are no weights to FP8
    for name in (
        "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias",
        "self_attn.kv_a_layernorm.weight",
    ):
        assert not layout.is_fp8(p + name)


def test_without_ignored_keywords_the_mla_projections_are_fp8_and_dense_layers_first():
    _, layout = _layer("deepseek-v3", 0, ignored=())
    assert _local(layout.fp8_names) == {
        "self_attn.q_a_proj.weight",
        "self_attn.q_b_proj.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
        "self_attn.kv_b_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    }


def test_moonlight_has_no_query_lora_and_two_shared_experts():
    shapes, layout = _layer("moonlight-16b-a3b", 1)
    p = "model.layers.1."
    assert shapes[p + "self_attn.q_proj.weight"] == (16 * 192, 2048)
    assert p + "self_attn.q_a_proj.weight" not in shapes
    assert shapes[p + "mlp.shared_experts.up_proj.weight"] == (2 * 1408, 2048)
    assert layout.is_fp8(p + "self_attn.q_proj.weight")  # no keyword matches q_proj
    assert not layout.is_fp8(p + "self_attn.kv_b_proj.weight")
    assert len(layout.fp8_names) == 64 * 3 + 3 + 2


def test_a_keyword_splitting_vllm_fused_qkv_a_is_refused():
    with pytest.raises(UserError, match="fused_qkv_a_proj"):
        _layer("deepseek-v3", 5, ignored=("q_a_proj",))
