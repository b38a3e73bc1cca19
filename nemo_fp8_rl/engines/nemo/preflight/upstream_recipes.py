"""The NeMo RL recipe files the project's large-scale recipes follow, and every key they change.

A recipe here follows one NeMo RL file (`examples/configs/recipes/llm/...`) key for key: every leaf
key that NeMo RL's file, or a recipe file it inherits from (not the `grpo_math_1B.yaml` base), sets
has the same value in the recipe's hand-off, except the keys in `deviations`, each with its reason.
`mismatches` compares a hand-off with NeMo RL's file as NeMo RL's loader resolves it
(tests/test_nemo_upstream_recipes.py runs it on both snapshots), and also reports a listed
deviation that no longer differs, so the list stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.nemo_defaults import compose, leaves

# Run paths and names derive from the recipe's file name (never copied).
DERIVED = ("checkpointing.checkpoint_dir", "logger.log_dir", "logger.wandb.name")

_STEPS = (
    "four optimiser steps per rollout batch (NeMo RL: one, the whole batch), so that the PPO "
    "ratio can leave 1 and clipping can act: calibration needs it and the FP8 recipe's rule "
    "refuses it otherwise (config/rules.py calibration_requirements)"
)
_ON_POLICY = (
    "NeMo RL forces the ratio to 1 (needs one optimiser step per batch); here the ratio is "
    "measured, as clipping and its calibration need"
)
_WANDB = "the project logs TensorBoard and metrics.jsonl; set logger.wandb_enabled=true for W&B"
_DSV3_TP = (
    "vLLM TP 16 in both precisions: block-FP8 MoE needs moe_intermediate_size / TP (2048 / TP) "
    "to be a multiple of 128, so NeMo RL's FP8 recipe uses 16; the BF16 sibling matches it"
)
_ROUTER = "FP32 router (NeMo RL's FP8 setting) in both precisions, so the pair differs only in FP8"
_DSV3_NAME = (
    "NeMo RL writes an instruction instead of a name; the recipe names the model (the BF16 "
    "conversion of its weights, NeMo RL's DeepSeek-V3 guide) so the preflight finds its config"
)
_SEQS = "max_num_seqs 32 of NeMo RL's FP8 recipe in both precisions (same vLLM concurrency)"


@dataclass(frozen=True)
class Follows:
    """One NeMo RL file a recipe follows, and the keys the recipe sets otherwise (key -> why)."""

    upstream: str  # relative to examples/configs/recipes/llm/
    deviations: dict[str, str] = field(default_factory=dict)


_DSV3 = {
    "policy.model_name": _DSV3_NAME,
    "policy.train_global_batch_size": _STEPS,
    "loss_fn.force_on_policy_ratio": _ON_POLICY,
    "logger.wandb_enabled": _WANDB,
    "logger.wandb.project": _WANDB,
    "policy.generation.vllm_cfg.tensor_parallel_size": _DSV3_TP,
}
_LLAMA = {
    "policy.train_global_batch_size": _STEPS,
    "loss_fn.force_on_policy_ratio": _ON_POLICY,
    "logger.wandb_enabled": _WANDB,
    "logger.wandb.project": _WANDB,
}
_MOONLIGHT = {
    "policy.train_global_batch_size": _STEPS,
    "grpo.val_period": "0 for NeMo RL's -1: both disable validation there (val_period > 0)",
    "policy.generation.vllm_kwargs.moe_backend": (
        "vLLM's Triton MoE backend, which NeMo RL's BF16 Moonlight recipe sets because the "
        "FlashInfer TRTLLM layout cannot be refit; in both precisions"
    ),
}

FOLLOWS: dict[str, Follows] = {
    "deepseek-v3/grpo-deepseek-v3-32n8g-bf16": Follows(
        "performance/grpo-deepseek-v3-32n8g.yaml",
        {
            **_DSV3,
            "policy.megatron_cfg.moe_router_dtype": _ROUTER,
            "policy.generation.vllm_kwargs.max_num_seqs": _SEQS,
        },
    ),
    "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-bf16": Follows(
        "performance/grpo-deepseek-v3-64n8g-async-1off.yaml",
        {
            **_DSV3,
            "policy.megatron_cfg.moe_router_dtype": _ROUTER,
            "policy.generation.vllm_kwargs.max_num_seqs": _SEQS,
        },
    ),
    "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8-uncalibrated": Follows(
        "performance/grpo-deepseek-v3-64n8g-fp8-async-1off.yaml",
        {k: v for k, v in _DSV3.items() if k != "policy.generation.vllm_cfg.tensor_parallel_size"},
    ),
    "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-bf16": Follows(
        "performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml", _LLAMA
    ),
    "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-fp8-uncalibrated": Follows(
        "performance/grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off.yaml", _LLAMA
    ),
    "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8-uncalibrated": Follows(
        "grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e.yaml", _MOONLIGHT
    ),
}


def own_keys(path: Path) -> list[str]:
    """Leaf keys set by `path` and the recipe files it inherits: composed with NeMo RL's
    `defaults:` rule (`config.nemo_defaults.compose`), the keys whose value comes from a file in a
    `recipes/` folder (NeMo RL's base configs sit outside one)."""
    config, prov = compose(Path(path).resolve())
    return [k for k in leaves(config) if "recipes" in Path(prov.get(k, "")).parts]


def mismatches(
    handoff: dict[str, Any], upstream: dict[str, Any], keys: list[str], follows: Follows
) -> list[str]:
    """Keys NeMo RL's file sets whose hand-off value differs without a listed reason, and listed
    deviations (of those keys or of NeMo RL's base values) whose values no longer differ; empty when the recipe follows the file exactly."""
    out = []
    # A deviation may also be of a value NeMo RL's base config gives (e.g. the batch size).
    for key in [*keys, *(k for k in follows.deviations if k not in keys)]:
        if key in DERIVED:
            continue
        ours, theirs = lookup(handoff, key), lookup(upstream, key)
        if key in follows.deviations:
            if ours == theirs:
                out.append(f"{key}: listed as a deviation but equal to NeMo RL's {theirs!r}")
        elif ours != theirs:
            shown = "<absent>" if is_missing(ours) else repr(ours)
            out.append(f"{key}: {shown} here, NeMo RL's {follows.upstream} has {theirs!r}")
    return out
