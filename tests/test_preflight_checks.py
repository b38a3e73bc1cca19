"""The preflight's engine checks without NeMo RL: vLLM's reproduced checks, megatron-core's
TransformerConfig, and the stand-in list docs/cluster.md shows (generated, held here).

The model configs are the shipped config.json files (engines/nemo/model_configs/); vLLM lines are
those of the vLLM versions NeMo RL pins (0.20.0 at v0.7.0, 0.25.1 at main 7ea279a).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config
from nemo_fp8_rl.engines.nemo.preflight.vllm_checks import (
    derived_max_len,
    engine_checks,
    pinned_vllm,
)

ROOT = Path(__file__).resolve().parents[1]
BLOCK = {
    "quantization": "fp8",
    "hf_overrides": {"quantization_config": {"weight_block_size": [128, 128]}},
}


def _check(model: str, version: str = "0.25.1", env: dict | None = None, **kwargs):
    kw = {"model": model, "tensor_parallel_size": 1, "max_model_len": 4096} | kwargs
    return engine_checks(kw, model_config(model), version, env or {})


def test_dense_fp8_block_shape_per_tp_partition():
    (err,) = _check("Qwen/Qwen3-4B", tensor_parallel_size=8, **BLOCK)
    assert err.key == "policy.generation.vllm_cfg.tensor_parallel_size"
    assert (err.file, err.line) == (
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
        1223,
    )
    assert "9728 / TP 8 = 1216" in err.message and "[1, 2, 4]" in err.fix
    assert _check("Qwen/Qwen3-4B", "0.20.0", tensor_parallel_size=8, **BLOCK)[0].line == 1126
    assert _check("Qwen/Qwen3-4B", tensor_parallel_size=4, **BLOCK) == []
    assert _check("Qwen/Qwen3-4B", tensor_parallel_size=8) == []  # BF16: no block shape


def test_moe_fp8_block_shape_and_expert_parallel():
    (err,) = _check("Qwen/Qwen3-30B-A3B", tensor_parallel_size=4, **BLOCK)
    assert (err.file, err.line) == ("vllm/model_executor/layers/quantization/fp8.py", 563)
    assert "768 / TP 4 = 192" in err.message and "[1, 2]" in err.fix
    assert _check("Qwen/Qwen3-30B-A3B", tensor_parallel_size=2, **BLOCK) == []
    # expert parallelism keeps each expert whole: 768 is a multiple of 128
    assert (
        _check("Qwen/Qwen3-30B-A3B", tensor_parallel_size=4, enable_expert_parallel=True, **BLOCK)
        == []
    )


def test_max_model_len_against_the_model_positions():
    (err,) = _check("Qwen/Qwen3-8B-Base", max_model_len=65536)
    assert err.key == "policy.generation.vllm_cfg.max_model_len"
    assert (err.file, err.line) == ("vllm/config/model.py", 2276)
    assert "max_position_embeddings=32768" in err.message and "32768" in err.fix
    assert _check("Qwen/Qwen3-8B-Base", max_model_len=32768) == []
    allowed = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert _check("Qwen/Qwen3-8B-Base", env=allowed, max_model_len=65536) == []


def test_rope_scaling_as_vllm_derives_it():
    llama = model_config("meta-llama/Llama-3.1-8B-Instruct")  # rope_type llama3: not scaled
    assert derived_max_len(llama) == (131072, "max_position_embeddings")
    yarn = {
        "max_position_embeddings": 32768,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    }
    assert derived_max_len(yarn)[0] == 131072
    linear = {"max_position_embeddings": 2048, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert derived_max_len(linear)[0] == 4096


def test_heads_kv_heads_and_memory_fraction():
    keys = {
        (e.key.rsplit(".", 1)[-1], e.file)
        for e in _check("Qwen/Qwen3-30B-A3B", tensor_parallel_size=6)
    }
    assert keys == {
        ("tensor_parallel_size", "vllm/config/model.py"),  # 32 heads % 6
        ("tensor_parallel_size", "vllm/model_executor/layers/linear.py"),  # 4 KV heads vs 6
    }
    assert _check("Qwen/Qwen3-30B-A3B", tensor_parallel_size=8) == []  # KV heads replicated
    (err,) = _check("Qwen/Qwen3-4B", gpu_memory_utilization=1.5)
    assert err.key.endswith("gpu_memory_utilization") and err.file == "vllm/config/cache.py"


def test_citations_follow_the_pinned_vllm(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "vllm = [\n  \"vllm==0.25.1 ; sys_platform != 'linux'\",\n]\n"
    )
    assert pinned_vllm(tmp_path) == "0.25.1"
    assert pinned_vllm(tmp_path / "absent") is None
    (err,) = _check("Qwen/Qwen3-4B", "9.9.9", tensor_parallel_size=8, **BLOCK)
    assert err.line == 0  # a version whose source was not read: the file, no line


def test_pinned_te_is_the_highest_transformer_engine_pin(tmp_path):
    from nemo_fp8_rl.engines.nemo.preflight.megatron_checks import pinned_te

    (tmp_path / "pyproject.toml").write_text(
        '"transformer-engine[pytorch] @ git+https://github.com/NVIDIA/TransformerEngine.git@v2.14.1",\n'
        '"transformer-engine[pytorch]==2.9.0",\n'
        '"vllm==0.25.1",\n'
    )
    assert pinned_te(tmp_path) == "2.14.1"  # compared as numbers, not as text
    assert pinned_te(tmp_path / "absent") is None


@pytest.mark.slow  # importing megatron-core takes minutes on a loaded machine
def test_transformer_config_runs_megatron_core_validation(tmp_path):
    pytest.importorskip("megatron.core")
    from nemo_fp8_rl.engines.nemo.preflight.megatron_checks import (
        pinned_te,
        transformer_config_check,
    )

    (tmp_path / "pyproject.toml").write_text(
        '"transformer-engine[pytorch] @ git+https://github.com/NVIDIA/TransformerEngine.git@v2.14.1",\n'
        '"transformer-engine[pytorch] @ git+https://github.com/NVIDIA/TransformerEngine.git@release_v2.15",\n'
    )
    assert pinned_te(tmp_path) == "2.15"
    mcfg = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "sequence_parallel": True,
        "pipeline_dtype": "bfloat16",
        "apply_rope_fusion": True,
        "fp8_cfg": {"enabled": True, "fp8": "e4m3", "fp8_recipe": "blockwise", "fp8_param": False},
    }
    policy = {"precision": "bfloat16", "megatron_cfg": mcfg}
    hf = model_config("Qwen/Qwen3-4B")
    assert transformer_config_check(policy, hf, "2.15") is None
    mcfg["tensor_model_parallel_size"] = 3  # 32 heads
    err = transformer_config_check(policy, hf, "2.15")
    assert err is not None and err.key == "policy.megatron_cfg.tensor_model_parallel_size"
    assert err.file == "megatron/core/transformer/transformer_config.py" and err.line > 0


def test_stand_in_list_in_the_docs_is_the_generated_one():
    from nemo_fp8_rl.engines.nemo.preflight.stand_ins import markdown

    doc = (ROOT / "docs" / "cluster.md").read_text()
    assert markdown() in doc, "regenerate: python -m nemo_fp8_rl.engines.nemo.preflight.stand_ins"


def test_cpu_loop_stand_in_list_in_the_docs_is_the_generated_one():
    from nemo_fp8_rl.engines.nemo.cpu.stand_ins import markdown

    doc = (ROOT / "docs" / "cluster.md").read_text()
    assert markdown() in doc, "regenerate: python -m nemo_fp8_rl.engines.nemo.cpu.stand_ins"
