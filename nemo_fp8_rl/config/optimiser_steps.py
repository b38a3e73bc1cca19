"""A `train_global_batch_size` that gives a rollout batch several optimiser steps.

Calibrated Clipping needs the PPO ratio to leave 1: with one optimiser step per rollout batch
(`train_global_batch_size` = prompts x generations, NeMo RL's default in most of its configs)
θ = θ_old on every token and nothing clips. `proposal` names the global batch size that splits
the rollout batch of S samples into K optimiser steps (K = 4, as the project's GPU recipes use,
else 2 or 8), such that each step's S / K samples split into whole micro-batches on every
data-parallel rank (S / K divisible by train_micro_batch_size x DP), and says what that changes.
"""

from __future__ import annotations

from typing import Any

PREFERRED_STEPS = (4, 2, 8)


def _get(config: dict, dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def data_parallel_size(config: dict) -> int:
    """DP of the Megatron policy: GPUs / (TP x PP x CP); 1 on a CPU recipe or when unknown."""
    gpus = (_get(config, "cluster.gpus_per_node", 0) or 0) * (
        _get(config, "cluster.num_nodes", 1) or 1
    )
    mcore = "policy.megatron_cfg"
    model = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size"):  # fmt: skip
        model *= _get(config, f"{mcore}.{key}", 1) or 1
    return max(1, gpus // model) if gpus and gpus % model == 0 else 1


def proposal(config: dict) -> tuple[int, int] | None:
    """(global batch size, optimiser steps K) for the first K of `PREFERRED_STEPS` that splits
    the rollout batch into whole micro-batches on every rank; None when none does."""
    samples = (_get(config, "grpo.num_prompts_per_step", 0) or 0) * (
        _get(config, "grpo.num_generations_per_prompt", 0) or 0
    )
    unit = (_get(config, "policy.train_micro_batch_size", 1) or 1) * data_parallel_size(config)
    for steps in PREFERRED_STEPS:
        if samples % steps == 0 and (samples // steps) % unit == 0:
            return samples // steps, steps
    return None


def fix_text(config: dict) -> str:
    """The fix line of the one-step calibration refusal: the value to set and what it changes."""
    found = proposal(config)
    samples = (_get(config, "grpo.num_prompts_per_step", 0) or 0) * (
        _get(config, "grpo.num_generations_per_prompt", 0) or 0
    )
    if found is None:
        return (
            "make train_global_batch_size a divisor of num_prompts_per_step x "
            f"num_generations_per_prompt ({samples}) smaller than it, and a multiple of "
            "train_micro_batch_size x data-parallel size"
        )
    gbs, steps = found
    return (
        f"set policy.train_global_batch_size={gbs} (an override, also on recipes import): "
        f"{steps} optimiser steps per rollout batch of {samples} samples, {gbs} each; the policy "
        "then moves between its steps, so the PPO ratio leaves 1 and clipping (and its "
        "calibration) can act; each step's gradient averages fewer samples, and NeMo RL steps "
        "its learning-rate schedule once per rollout batch either way"
    )
