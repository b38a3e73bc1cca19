"""Preflight of `refit.quantize_on: trainer`: the metadata step against vLLM's FP8 list, which
NeMo RL's `init_fp8` fixes through `hf_overrides.quantization_config.ignored_layers`."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config
from nemo_fp8_rl.engines.nemo.preflight.refit_check import refit_findings, vllm_fp8_names

MODEL = "Qwen/Qwen3-4B"
PROJ = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def recipe(first_bf16: int = 0, quantize_on: str = "trainer") -> dict:
    vllm_cfg = {"precision": "fp8", "num_first_layers_in_bf16": first_bf16}
    return {"refit": {"quantize_on": quantize_on}, "policy": {"generation": {"vllm_cfg": vllm_cfg}}}


def llm_kwargs(ignored: list) -> dict:
    """`vllm.LLM` FP8 arguments as NeMo RL's `init_fp8` builds them."""
    qcfg = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    if ignored:
        qcfg["ignored_layers"] = ignored
    return {"quantization": "fp8", "hf_overrides": {"quantization_config": qcfg}}


def layer0() -> list[str]:
    return [f"model.layers.0.{p}" for p in PROJ]


@pytest.mark.slow  # builds the model on the meta device (transformers import)
def test_matching_layouts_pass() -> None:
    hf = model_config(MODEL)
    assert refit_findings(recipe(), llm_kwargs([]), hf, Path("/nowhere")) == []
    assert refit_findings(recipe(1), llm_kwargs(layer0()), hf, Path("/nowhere")) == []
    assert refit_findings(recipe(1, "generator"), llm_kwargs([]), hf, Path("/nowhere")) == []


@pytest.mark.slow  # builds the model on the meta device (transformers import)
def test_a_layer_vllm_holds_in_fp8_but_the_trainer_keeps_bf16_is_located() -> None:
    # v0.7.0's init_fp8 appends the BF16 layer list as one nested list, which vLLM's
    # `prefix in ignored_layers` never matches: vLLM quantizes layer 0 anyway
    (err,) = refit_findings(
        recipe(1), llm_kwargs([layer0()]), model_config(MODEL), Path("/nowhere")
    )
    assert err.key == "refit.quantize_on"
    assert err.file.endswith("quantization/fp8.py")
    assert "model.layers.0.self_attn.q_proj.weight" in err.message
    assert "not quantized on the trainer" in err.message and "generator" in err.fix


@pytest.mark.slow  # builds the model on the meta device (transformers import)
def test_no_block_fp8_in_vllm_is_located() -> None:
    (err,) = refit_findings(recipe(), {"quantization": None}, model_config(MODEL), Path("/nowhere"))
    assert "no 128x128 block FP8" in err.message


def test_vllm_list_skips_a_whole_expert_layer() -> None:
    names = [
        f"model.layers.0.mlp.experts.{e}.{p}.weight"
        for e in range(2)
        for p in ("gate_proj", "down_proj")
    ]
    names += ["model.layers.0.self_attn.q_proj.weight"]
    held = vllm_fp8_names(names, 2, ["model.layers.0.mlp.experts.1.down_proj"])
    assert held == {"model.layers.0.self_attn.q_proj.weight"}


@pytest.mark.parametrize(
    "ignored", [["model.layers.3.mlp.down_proj"], [["model.layers.3.mlp.down_proj"]]]
)
def test_vllm_list_reads_ignored_layers_as_vllm_does(ignored: list) -> None:
    names = ["model.layers.3.mlp.down_proj.weight", "model.norm.weight"]
    held = vllm_fp8_names(names, 4, ignored)
    assert held == (
        set() if isinstance(ignored[0], str) else {"model.layers.3.mlp.down_proj.weight"}
    )
