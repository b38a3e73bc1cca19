"""Asynchronous GRPO on the NeMo RL engine: which training loop runs, and what it refuses.

With `grpo.async_grpo.enabled` the engine runs NeMo RL's `async_grpo_train` instead of
`grpo_train`, as NeMo RL's `examples/run_grpo.py` does, on the same `setup()` objects, with the
same substitutions (the `ShadowPolicy`, the project's loss, the metrics tee). `async_grpo_train`
calls the policy exactly as `grpo_train` does (`get_logprobs` for `prev_logprobs` at the training
weights, `get_reference_policy_logprobs`, `train(data, loss_fn, timer=...)`, the refit and
checkpoint calls), in its own main loop, while a Ray actor (`AsyncTrajectoryCollector`) generates
with weights up to `max_trajectory_age_steps` old; `ShadowPolicy` overrides only `train` and
`save_checkpoint` and passes every other call through, so the shadow passes and the calibrator
run unchanged. What the ratios mean for old trajectories: docs/calibrated-clipping.md,
"Asynchronous GRPO".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nemo_fp8_rl.config import engine_rules


def is_async(cfg: dict[str, Any]) -> bool:
    """Whether the recipe runs NeMo RL's asynchronous GRPO."""
    return engine_rules.is_async(cfg)


def async_problems(cfg: dict[str, Any]) -> list[str]:
    """What NeMo RL refuses for asynchronous GRPO (`config.engine_rules`, also checked when the
    recipe is loaded), each as `key: what. Fix: how`."""
    return [replace(i, file=None).render() for i in engine_rules.async_grpo_issues(cfg, {})]


def training_loop(grpo: Any, cfg: dict[str, Any], setup: tuple[Any, ...]) -> Callable[..., None]:
    """`grpo.grpo_train`, or `grpo.async_grpo_train` with the arguments `run_grpo.py` adds:
    the trajectory age and, where `setup()` returns them (both snapshots), the teacher groups."""
    if not is_async(cfg):
        return grpo.grpo_train
    extra: dict[str, Any] = {
        "max_trajectory_age_steps": int(cfg["grpo"]["async_grpo"]["max_trajectory_age_steps"])
    }
    if len(setup) >= 13:  # (..., master_config, teacher_worker_groups, alias_to_group_alias)
        extra["teacher_worker_groups"], extra["alias_to_group_alias"] = setup[11], setup[12]
    return functools.partial(grpo.async_grpo_train, **extra)
