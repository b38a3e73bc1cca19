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
from typing import Any

# What NeMo RL's run_grpo.py refuses before it calls async_grpo_train (the same lines in
# 7ea279a and v0.7.0), and what async_grpo_train asserts at its start: (key, value refused, fix).
_REFUSED: tuple[tuple[str, Any, str], ...] = (
    ("grpo.use_dynamic_sampling", True, "set grpo.use_dynamic_sampling: false"),
    ("grpo.reward_scaling.enabled", True, "set grpo.reward_scaling.enabled: false"),
    ("grpo.reward_shaping.enabled", True, "set grpo.reward_shaping.enabled: false"),
    ("data.use_multiple_dataloader", True, "set data.use_multiple_dataloader: false"),
    ("policy.generation.vllm_cfg.async_engine", False, "set it true (vLLM's async engine)"),
    ("policy.generation.colocated.enabled", True, "set it false and give generation its nodes"),
    ("loss_fn.use_importance_sampling_correction", False, "set it true (TIS/icepop)"),
)
_WHERE = {
    "grpo.use_dynamic_sampling": "examples/run_grpo.py",
    "grpo.reward_scaling.enabled": "examples/run_grpo.py",
    "grpo.reward_shaping.enabled": "examples/run_grpo.py",
    "data.use_multiple_dataloader": "examples/run_grpo.py",
    "policy.generation.vllm_cfg.async_engine": "async_grpo_train (should_use_async_rollouts)",
    "policy.generation.colocated.enabled": "async_grpo_train (colocated: Megatron generation only)",
    "loss_fn.use_importance_sampling_correction": "async_grpo_train",
}


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def is_async(cfg: dict[str, Any]) -> bool:
    """Whether the recipe runs NeMo RL's asynchronous GRPO."""
    return bool(_get(cfg, "grpo.async_grpo.enabled"))


def async_problems(cfg: dict[str, Any]) -> list[str]:
    """What NeMo RL refuses for asynchronous GRPO, each with where it refuses and the fix."""
    if not is_async(cfg):
        return []
    out = []
    for key, refused, fix in _REFUSED:
        if bool(_get(cfg, key)) == refused:
            out.append(
                f"{key}: {refused} is refused with grpo.async_grpo.enabled by NeMo RL's "
                f"{_WHERE[key]}. Fix: {fix}"
            )
    if (_get(cfg, "grpo.async_grpo.max_trajectory_age_steps") or 0) < 1:
        out.append(
            "grpo.async_grpo.max_trajectory_age_steps: must be >= 1 for asynchronous GRPO. "
            "Fix: set 1 (one step old, NeMo RL's async-1off recipes)"
        )
    return out


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
