"""The shipped config.json files of the paper recipes' larger models: they load as transformers
configs, and every weight GEMM dimension divides into 128-blocks at the recipes' parallel sizes
(block-scaled FP8 training and rollout need it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from nemo_fp8_rl.config import load_recipe

CONFIGS = Path(__file__).parents[1] / "nemo_fp8_rl" / "engines" / "nemo" / "model_configs"
RECIPES = {
    "Qwen/Qwen3-14B-Base": "paper-fp8-rl/qwen3-14b-base/dapo-qwen3-14b-base-2n8g-8k-fp8-blockwise",
    "Qwen/Qwen2.5-32B": "paper-fp8-rl/qwen2.5-32b/grpo-qwen2.5-32b-4n8g-8k-fp8-blockwise",
}


@pytest.mark.parametrize("model", list(RECIPES))
def test_model_config_loads_and_blocks_divide(model, tmp_path):
    src = CONFIGS / f"{model.replace('/', '--')}.json"
    (tmp_path / "config.json").write_text(src.read_text())
    cfg = AutoConfig.from_pretrained(tmp_path)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    recipe = load_recipe(RECIPES[model]).config
    assert recipe["policy"]["model_name"] == model
    tp = recipe["policy"]["megatron_cfg"]["tensor_model_parallel_size"]
    vtp = recipe["policy"]["generation"]["vllm_cfg"]["tensor_parallel_size"]
    for parts in (tp, vtp):
        assert cfg.num_attention_heads % parts == 0 and cfg.num_key_value_heads % parts == 0
        for dim in (cfg.hidden_size, cfg.intermediate_size, head * cfg.num_key_value_heads):
            assert dim % parts == 0 and (dim // parts) % 128 == 0, (model, dim, parts)
    assert json.loads(src.read_text())["torch_dtype"] == "bfloat16"


MLA = {
    "deepseek-ai/DeepSeek-V3": "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8",
    "moonshotai/Moonlight-16B-A3B-Instruct": "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8",
}


@pytest.mark.parametrize("model", list(MLA))
def test_mla_model_config_loads_and_expert_blocks_divide(model, tmp_path):
    """DeepSeek-V3-architecture configs: they load as transformers' DeepseekV3Config (BF16, no
    quantization_config: the BF16 weights a run trains), the recipe's pipeline stages hold every
    layer, and vLLM's TP leaves each expert's intermediate slice a whole number of 128-blocks."""
    src = CONFIGS / f"{model.replace('/', '--')}.json"
    (tmp_path / "config.json").write_text(src.read_text())
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == "deepseek_v3" and "quantization_config" not in json.loads(
        src.read_text()
    )
    recipe = load_recipe(MLA[model]).config
    assert recipe["policy"]["model_name"] == model
    mcore = recipe["policy"]["megatron_cfg"]
    pp, first, last = (
        mcore["pipeline_model_parallel_size"],
        mcore["num_layers_in_first_pipeline_stage"],
        mcore["num_layers_in_last_pipeline_stage"],
    )
    assert (cfg.num_hidden_layers - first - last) % (pp - 2) == 0
    assert cfg.n_routed_experts % mcore["expert_model_parallel_size"] == 0
    vtp = recipe["policy"]["generation"]["vllm_cfg"]["tensor_parallel_size"]
    assert (cfg.moe_intermediate_size // vtp) % 128 == 0 and cfg.num_attention_heads % vtp == 0
