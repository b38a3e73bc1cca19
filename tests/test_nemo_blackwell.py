"""The Blackwell recipes (MXFP8, `vllm_cfg.is_mx`) against a real NeMo RL tree (`NEMO_RL_SRC`).

Every Blackwell recipe's rehearsal is in test_nemo_preflight (passing on main 7ea279a, refused
with the reason on v0.7.0). Here: the engine's own refusal before anything starts on a NeMo RL
that does not read `is_mx`, the MXFP8 MoE backend refusal located in NeMo RL's file, and
`refit.quantize_on: trainer` with MXFP8 through the preflight's refit check (the MXFP8 pairs
the Megatron worker plans against the weights NeMo RL's real `init_fp8` has vLLM hold in MXFP8).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_nemo_contract import _skip_reason

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.mx_support import FP8_FILE, READS_IS_MX, mx_problems

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]

SRC = Path(os.environ.get("NEMO_RL_SRC", "."))
FULL = "qwen3-4b/grpo-qwen3-4b-2n4g-fp8-mxfp8"
MOE = "qwen3-30b-a3b/grpo-qwen3-30b-a3b-4n4g-fp8-mxfp8-rollout"


def _reads_is_mx() -> bool:
    return READS_IS_MX in (SRC / FP8_FILE).read_text()


def _preflight(recipe):
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    return preflight(recipe, workdir=SRC)


def test_engine_refuses_is_mx_where_nemo_rl_does_not_read_it() -> None:
    """`run` refuses before Ray, the run dir or anything else (`_refuse_mx_problems`)."""
    from nemo_fp8_rl.engines.nemo.driver import compat, runner

    info = compat.detect()
    recipe = load_recipe(FULL)
    if _reads_is_mx():
        runner._refuse_mx_problems(recipe, info)  # nothing to refuse
        bf16 = load_recipe(FULL.replace("fp8-mxfp8", "bf16"))
        assert mx_problems(bf16.config, SRC) == []
        return
    with pytest.raises(runner.EngineConfigError) as err:
        runner._refuse_mx_problems(recipe, info)
    text = str(err.value)
    assert "policy.generation.vllm_cfg.is_mx: this NeMo RL does not read is_mx" in text
    assert f"{FP8_FILE}:" in text and "7ea279a or later" in text


def test_mxfp8_moe_with_another_backend_is_refused_at_nemo_rls_check() -> None:
    if not _reads_is_mx():
        pytest.skip("this NeMo RL does not read is_mx (its refusal comes first)")
    result = _preflight(load_recipe(MOE, ["policy.generation.vllm_kwargs.moe_backend=triton"]))
    assert not result.ok
    (err,) = [e for e in result.errors if e.key == "policy.generation.vllm_kwargs.moe_backend"]
    line = (SRC / err.file).read_text().splitlines()[err.line - 1]
    assert err.file == FP8_FILE and "only supports FLASHINFER_TRTLLM" in line
    assert "flashinfer_trtllm" in err.fix


def test_trainer_side_mxfp8_refit_matches_what_vllm_holds() -> None:
    if not _reads_is_mx():
        pytest.skip("this NeMo RL does not read is_mx")
    result = _preflight(load_recipe(FULL, ["refit.quantize_on=trainer"]))
    assert result.ok, result.report()
    qcfg = result.rehearsal.llm_kwargs["hf_overrides"]["quantization_config"]
    assert qcfg["quant_algo"] == "MXFP8"


def test_moe_mxfp8_refits_experts_one_by_one_and_the_grouped_path_is_refused() -> None:
    """NeMo RL 7ea279a's `load_weights` raises NotImplementedError on a grouped expert slab
    vLLM holds in MXFP8 (fp8.py: "MXFP8 refit does not support grouped MoE expert weights").
    Megatron-Bridge's Qwen3-MoE bridge (the commit 7ea279a pins) sends the experts one by one,
    so the MoE MXFP8 recipe's rehearsal passes on both refit paths (generator side as shipped,
    trainer side with its pairs planned from those names); a DTensor trainer sends
    transformers 5's grouped slabs and is refused by the guard rails with NeMo RL's line."""
    if not _reads_is_mx():
        pytest.skip("this NeMo RL does not read is_mx")
    for overrides in ([], ["refit.quantize_on=trainer"]):
        result = _preflight(load_recipe(MOE, overrides))
        assert result.ok, result.report()
        assert "pass  grouped-experts-mxfp8" in result.report()
    dtensor = ["policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true"]
    result = _preflight(load_recipe(MOE, dtensor))
    assert not result.ok
    assert "does not support grouped MoE expert weights" in result.report()
    assert "grouped-experts-mxfp8" in result.report()


def test_trainer_side_mxfp8_refit_is_refused_against_a_block_fp8_engine() -> None:
    """The pairs are MXFP8, the engine block FP8: the refit check names both."""
    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config
    from nemo_fp8_rl.engines.nemo.preflight.refit_check import refit_findings

    if not _reads_is_mx():
        pytest.skip("this NeMo RL does not read is_mx")
    cfg = load_recipe(FULL, ["refit.quantize_on=trainer"]).config
    block = {
        "quantization": "fp8",
        "hf_overrides": {"quantization_config": {"weight_block_size": [128, 128]}},
    }
    (err,) = refit_findings(cfg, block, model_config(cfg["policy"]["model_name"]), SRC)
    assert "serves block" in err.message and "pairs are MXFP8" in err.message
