"""The large-scale recipes follow NeMo RL's own recipe files key for key (against a NeMo RL tree).

Each recipe in `upstream_recipes.FOLLOWS` is compared with the NeMo RL file it names, resolved by
NeMo RL's own loader: every key NeMo RL's recipe files set has the same value in the hand-off, or is
a listed deviation with its reason. Run with scripts/nemo-rl-contract.sh on each snapshot.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.handoff import to_nemo_config
from nemo_fp8_rl.engines.nemo.preflight.upstream_recipes import (
    FOLLOWS,
    Follows,
    mismatches,
    own_keys,
)

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not SRC, reason="NEMO_RL_SRC is not set (scripts/nemo-rl-contract.sh)"),
]


def _upstream(name: str) -> tuple[dict, list[str]]:
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import load_exemplar

    path = Path(str(SRC)) / "examples" / "configs" / "recipes" / "llm" / FOLLOWS[name].upstream
    return load_exemplar(path), own_keys(path)


@pytest.mark.parametrize("name", list(FOLLOWS))
def test_recipe_follows_nemo_rl_key_for_key(name):
    upstream, keys = _upstream(name)
    assert len(keys) > 15
    assert mismatches(to_nemo_config(load_recipe(name)), upstream, keys, FOLLOWS[name]) == []


def test_a_changed_key_is_reported_with_nemo_rl_value():
    name = "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8-uncalibrated"
    upstream, keys = _upstream(name)
    handoff = to_nemo_config(load_recipe(name))
    handoff["policy"]["generation"]["vllm_cfg"]["quantization_ignored_layer_kws"] = ["a_proj"]
    del handoff["policy"]["megatron_cfg"]["moe_grouped_gemm"]
    found = mismatches(handoff, upstream, keys, FOLLOWS[name])
    assert any(
        f.startswith("policy.generation.vllm_cfg.quantization_ignored_layer_kws:") for f in found
    )
    assert "policy.megatron_cfg.moe_grouped_gemm: <absent> here" in " ".join(found)
    stale = Follows(FOLLOWS[name].upstream, {"grpo.max_num_steps": "no longer differs"})
    assert any(
        "listed as a deviation but equal" in f for f in mismatches(handoff, upstream, keys, stale)
    )
