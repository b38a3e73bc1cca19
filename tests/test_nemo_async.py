"""Asynchronous GRPO against a real NeMo RL tree (`NEMO_RL_SRC`; scripts/nemo-rl-contract.sh).

- `async_loop.training_loop` binds to this snapshot's real `async_grpo_train`;
- every attribute `async_grpo_train` (and `refit_policy_generation`, which it calls with the
  policy) reads on the policy reaches NeMo RL's policy through `ShadowPolicy`, and the calls it
  overrides take the keywords `async_grpo_train` passes (read from the source with `ast`);
- the preflight runs `grpo.setup()` with the real `Policy` / `VllmGeneration` constructors on
  non-colocated clusters and reaches `async_grpo_train` with the project's objects.
"""

from __future__ import annotations

import ast
import inspect
import os

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.async_loop import training_loop
from nemo_fp8_rl.engines.nemo.driver.shadow import ShadowPolicy
from nemo_fp8_rl.engines.nemo.worker.loss import NemoCalibratedLoss

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not SRC, reason="NEMO_RL_SRC is not set (scripts/nemo-rl-contract.sh)"),
]
RECIPE = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-fp8"


def _policy_uses(fn) -> tuple[set[str], list[set[str]]]:
    """Attribute names read on the name `policy` in `fn`, and the keywords of each policy.train."""
    tree = ast.parse(inspect.getsource(fn).lstrip())
    names, train_keywords = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "policy":
            names.add(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "train"
            and getattr(node.func.value, "id", None) == "policy"
        ):
            train_keywords.append({k.arg for k in node.keywords})
    return names, train_keywords


class _Wrapped:
    """Answers every attribute with a unique marker, so forwarding can be seen."""

    def __getattr__(self, name: str):
        return ("wrapped", name)


def test_training_loop_binds_to_the_real_async_grpo_train():
    from nemo_rl.algorithms import grpo

    cfg = load_recipe(RECIPE).config
    setup = tuple(f"s{i}" for i in range(13))
    loop = training_loop(grpo, cfg, setup)
    assert loop.func is grpo.async_grpo_train and loop.keywords["max_trajectory_age_steps"] == 1
    inspect.signature(grpo.async_grpo_train).bind(*[None] * 12, **loop.keywords)
    sync = load_recipe("llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8").config
    assert training_loop(grpo, sync, setup) is grpo.grpo_train


def test_shadow_policy_passes_every_async_policy_call_through():
    from nemo_rl.algorithms import grpo

    names, trains = _policy_uses(grpo.async_grpo_train)
    refit_names, _ = _policy_uses(grpo.refit_policy_generation)
    assert {"train", "get_logprobs", "prepare_for_training"} <= names and trains
    shadow = ShadowPolicy(
        _Wrapped(),
        NemoCalibratedLoss(load_recipe(RECIPE).section("loss_fn")),
        start_step=0,
        global_batch_size=512,
        switch=lambda on: None,
        hold_schedule=lambda held: None,
    )
    own = {"train", "save_checkpoint"}
    for name in sorted((names | refit_names) - own):
        assert getattr(shadow, name) == ("wrapped", name), name
    params = inspect.signature(ShadowPolicy.train).parameters
    for keywords in trains:
        assert keywords <= set(params) | {"timer"} or any(
            p.kind is p.VAR_KEYWORD for p in params.values()
        )


def test_preflight_reaches_async_grpo_train_with_the_project_objects():
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    result = preflight(load_recipe(RECIPE), workdir=SRC)
    assert result.ok, result.report()
    train = result.rehearsal.train
    assert train.loop() == "async_grpo_train"
    (_name, args, kwargs) = train.calls[0]
    assert isinstance(args[0], ShadowPolicy) and isinstance(args[5], NemoCalibratedLoss)
    assert kwargs["max_trajectory_age_steps"] == 1
    sizes = [c.kwargs.get("bundle_ct_per_node_list") for c in result.rehearsal.clusters]
    assert sizes == [[8], [8]]  # training node and generation node, not colocated
