"""The large-scale recipes follow NeMo RL's own recipe files key for key (against a NeMo RL tree).

Each recipe in `upstream_recipes.FOLLOWS` is compared with the NeMo RL file it names, resolved by
NeMo RL's own loader: every leaf key of the resolved file (its recipe chain and the
`grpo_math_1B.yaml` base) has the same value in the hand-off, or is a listed deviation with its
reason (the recipe's own, or `COMMON` to every followed recipe, each of which is in use). Run with scripts/nemo-rl-contract.sh on each snapshot.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.handoff import to_nemo_config
from nemo_fp8_rl.engines.nemo.preflight.upstream_recipes import (
    COMMON,
    FOLLOWS,
    Follows,
    common_in_use,
    mismatches,
    resolved_keys,
)

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not SRC, reason="NEMO_RL_SRC is not set (scripts/nemo-rl-contract.sh)"),
]


def _upstream(name: str) -> tuple[dict, list[str]]:
    from nemo_fp8_rl.engines.nemo.preflight.exemplars import load_exemplar

    path = Path(str(SRC)) / "examples" / "configs" / "recipes" / "llm" / FOLLOWS[name].upstream
    upstream = load_exemplar(path)
    return upstream, resolved_keys(upstream)


@pytest.mark.parametrize("name", list(FOLLOWS))
def test_recipe_follows_nemo_rl_key_for_key(name):
    upstream, keys = _upstream(name)
    assert len(keys) > 250  # the base layer's keys are compared too (~290 on v0.7.0, ~330 on main)
    assert mismatches(to_nemo_config(load_recipe(name)), upstream, keys, FOLLOWS[name]) == []


def test_the_base_layer_is_compared():
    """A key only `grpo_math_1B.yaml` sets (TIS off there) is compared, and its reason is listed."""
    name = "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8-uncalibrated"
    upstream, keys = _upstream(name)
    assert "loss_fn.truncated_importance_sampling_type" in keys
    handoff = to_nemo_config(load_recipe(name))
    handoff["policy"]["megatron_cfg"]["optimizer"]["min_lr"] = 1.0e-7
    found = mismatches(handoff, upstream, keys, FOLLOWS[name])
    assert any(f.startswith("policy.megatron_cfg.optimizer.min_lr: 1e-07 here") for f in found)


def test_every_common_deviation_is_in_use():
    used: set[str] = set()
    for name in FOLLOWS:
        upstream, keys = _upstream(name)
        used |= common_in_use(to_nemo_config(load_recipe(name)), upstream, keys)
    assert set(COMMON) - used == set()


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
