"""What the NeMo RL engine refuses for asynchronous GRPO (as NeMo RL's run_grpo.py and
async_grpo_train refuse it), each reported with where NeMo RL refuses it and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver import runner
from nemo_fp8_rl.engines.nemo.driver.async_loop import async_problems, is_async

ASYNC = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-fp8"


def test_async_recipes_pass_and_sync_recipes_are_not_async():
    cfg = load_recipe(ASYNC).config
    assert is_async(cfg) and async_problems(cfg) == []
    sync = load_recipe("llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8").config
    assert not is_async(sync) and async_problems(sync) == []


@pytest.mark.parametrize(
    ("key", "value", "where"),
    [
        ("policy.generation.colocated.enabled", True, "async_grpo_train (colocated"),
        ("policy.generation.vllm_cfg.async_engine", False, "should_use_async_rollouts"),
        ("grpo.use_dynamic_sampling", True, "examples/run_grpo.py"),
        ("loss_fn.use_importance_sampling_correction", False, "async_grpo_train"),
    ],
)
def test_refusals_name_nemo_rl_and_the_fix(key, value, where):
    recipe = load_recipe(ASYNC)
    cfg = recipe.config
    node = cfg
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    (problem,) = [
        p for p in runner.check_recipe(dataclasses.replace(recipe, config=cfg)) if key in p
    ]
    assert problem.startswith(f"{key}: {value}") and where in problem and "Fix: " in problem
