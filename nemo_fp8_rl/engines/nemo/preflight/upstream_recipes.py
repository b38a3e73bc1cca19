"""The NeMo RL recipe files the project's large-scale recipes follow, and every key they change.

A recipe here follows one NeMo RL file (`examples/configs/recipes/llm/...`) key for key: every leaf
key of NeMo RL's file as NeMo RL's loader resolves it (its recipe chain and the `grpo_math_1B.yaml`
base it ends in) has the same value in the recipe's hand-off, except the keys in `deviations`
(one recipe) and under `COMMON` (every followed recipe: the project's base config and its backend
choices), each with its reason. `mismatches` compares a hand-off with NeMo RL's resolved file
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
DERIVED = (
    "checkpointing.checkpoint_dir",
    "logger.log_dir",
    "logger.wandb.name",
    "logger.swanlab.name",
    "logger.mlflow.run_name",
)
_TIS = (
    "token-level TIS (C = 2) on in every recipe: the project's rule for FP8 rollouts (generation "
    "and training see different weights, so the importance-sampling correction is needed, "
    "config/rules.py), kept in the BF16 sibling so the pair differs only in precision; NeMo RL's "
    "recipes leave TIS off"
)
_DTENSOR = (
    "the DTensor backend's settings: these recipes train on Megatron (megatron_cfg.enabled), and "
    "NeMo RL reads policy.dtensor_cfg (beyond `enabled`), policy.optimizer and policy.scheduler "
    "only for DTensor; the project's base leaves them out"
)
# Differences of every followed recipe from NeMo RL's resolved file (key or section -> why).
COMMON: dict[str, str] = {
    "loss_fn.truncated_importance_sampling_type": _TIS,
    "loss_fn.truncated_importance_sampling_ratio": _TIS,
    "checkpointing.model_save_format": (
        "null: NeMo RL's Policy refuses a save format outside DTensor v2 at the first save; "
        "Megatron writes its own (torch_dist)"
    ),
    "policy.dtensor_cfg": _DTENSOR,
    "policy.optimizer": _DTENSOR,
    "policy.scheduler": _DTENSOR,
    "policy.generation.mcore_generation_config": (
        "Megatron-Core inference settings: read only with policy.generation.backend megatron; "
        "these recipes generate with vLLM"
    ),
    "policy.generation.port_range_low": (
        "not set: NeMo RL's defaults apply (DEFAULT_GENERATION_PORT_RANGE_LOW/HIGH, 3000-4999 "
        "on main)"
    ),
    "policy.generation.port_range_high": "as policy.generation.port_range_low",
    "cluster.master_port_range_low": (
        "not set: NeMo RL's defaults apply (DEFAULT_MASTER_PORT_RANGE_LOW/HIGH, 1400-1999 on main)"
    ),
    "cluster.master_port_range_high": "as cluster.master_port_range_low",
    "policy.generation.vllm_cfg.use_tqdm": (
        "vLLM's per-batch progress bars off: the run prints its own progress line; no value changes"
    ),
    "policy.megatron_cfg.env_vars": "{} for NeMo RL's null: no extra variables either way",
    "logger.wandb.project": "the project's own name for its runs (W&B, SwanLab, MLflow)",
    "logger.swanlab.project": "the project's own name for its runs (W&B, SwanLab, MLflow)",
    "logger.mlflow.experiment_name": "the project's own name for its runs (W&B, SwanLab, MLflow)",
}

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
    # keys where an older NeMo RL snapshot's file differs from main's, which the recipe follows
    # (not reported when equal: on main they are)
    older: dict[str, str] = field(default_factory=dict)


_DSV3 = {
    "policy.model_name": _DSV3_NAME,
    "policy.train_global_batch_size": _STEPS,
    "loss_fn.force_on_policy_ratio": _ON_POLICY,
    "logger.wandb_enabled": _WANDB,
    "policy.generation.vllm_cfg.tensor_parallel_size": _DSV3_TP,
    "policy.tokenizer.name": _DSV3_NAME,
}
_LLAMA = {
    "policy.train_global_batch_size": _STEPS,
    "loss_fn.force_on_policy_ratio": _ON_POLICY,
    "logger.wandb_enabled": _WANDB,
    "policy.megatron_cfg.moe_permute_fusion": (
        "off (the project's base): a Mixture-of-Experts setting, and Llama 3.1 8B has no experts, "
        "so no value changes"
    ),
}
_MOONLIGHT = {
    "policy.train_global_batch_size": _STEPS,
    "grpo.val_period": "0 for NeMo RL's -1: both disable validation there (val_period > 0)",
    "policy.generation.vllm_kwargs.moe_backend": (
        "vLLM's Triton MoE backend, which NeMo RL's BF16 Moonlight recipe sets because the "
        "FlashInfer TRTLLM layout cannot be refit; in both precisions"
    ),
    "grpo.max_num_steps": "500 steps, a finite run, where NeMo RL's file runs until stopped",
    "logger.tensorboard_enabled": "TensorBoard on: the project's compare and report read it",
}

_FULL_FP8 = (
    "FP8 training too (full-pipeline FP8, the project's subject: the fp8-blockwise overlay, the FP8 "
    "keys of NeMo RL's grpo_math_8B_megatron_fp8.yaml); NeMo RL's file trains in BF16 under its "
    "FP8 generation"
)
_PRECISION_AWARE = (
    "off with FP8 training, as NeMo RL's FP8-training recipes set it (grpo_math_8B_megatron_fp8.yaml, "
    "grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml: use_precision_aware_optimizer: false); "
    "NeMo RL's file, training in BF16, keeps it on"
)
_DENSE = (
    "off (the project's base): a Mixture-of-Experts setting, and the model has no experts, so no "
    "value changes"
)
_GROUP = (
    "16 samples per prompt, the project's base group size in every GPU recipe (BF16/FP8 pairs and "
    "models compared at one group size); NeMo RL's 32 doubles the samples generated per step"
)
_LLAMA_SYNC = {
    "grpo.num_generations_per_prompt": _GROUP,
    "policy.train_global_batch_size": (
        "four optimiser steps per rollout batch (32 prompts x 16 samples / 128; NeMo RL: 32 x 32 / "
        "512, two), so that the PPO ratio can leave 1 and clipping, and its calibration, can act "
        "(config/rules.py calibration_requirements)"
    ),
    "policy.megatron_cfg.moe_permute_fusion": _DENSE,
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer": _PRECISION_AWARE,
    "policy.megatron_cfg.fp8_cfg.enabled": _FULL_FP8,
    "policy.generation.vllm_cfg.gpu_memory_utilization": (
        "0.4 of the BF16 sibling (an FP8 recipe keeps its sibling's value so that the pair differs "
        "only in precision, configs/precision/fp8-blockwise.yaml); the KV cache is sized by the "
        "kv_cache_memory_bytes pin, which takes precedence"
    ),
    "logger.wandb_enabled": _WANDB,
}
_LLAMA_SYNC_OLDER = {
    "policy.generation.vllm_kwargs.kv_cache_memory_bytes": (
        "20 GiB of KV cache as NeMo RL main's file sets it (v0.7.0's sets none; the recipe's comment "
        "says why one recipe serves both)"
    )
}
_QWEN_SYNC = {
    "grpo.max_num_steps": "500 steps, a finite run, where NeMo RL's file runs until stopped",
    "checkpointing.enabled": (
        "on: --resume, eval and refit export read the run's checkpoints; NeMo RL's file saves none"
    ),
    "logger.tensorboard_enabled": "TensorBoard on: the project's compare and report read it",
    "policy.train_global_batch_size": _STEPS,
    "policy.megatron_cfg.moe_permute_fusion": _DENSE,
    "policy.megatron_cfg.defer_fp32_logits": (
        "on, the project's base for every Megatron recipe (NeMo RL's Llama 3.1 8B FP8-rollout "
        "recipe sets the same): the model returns its logits without Megatron's FP32 cast "
        "(fp32_output off) and NeMo RL casts them where it computes the log-probabilities"
    ),
    "policy.megatron_cfg.scheduler.lr_decay_iters": (
        "1000 of the project's base for NeMo RL's null: read by a decaying schedule only, and "
        "lr_decay_style is constant in both, so the learning rate after warm-up is the same"
    ),
    "policy.megatron_cfg.fp8_cfg.enabled": _FULL_FP8,
    "policy.generation.vllm_kwargs.kv_cache_memory_bytes": (
        "the KV cache pinned to 20 GiB (configs/vllm/kv-cache-20gib.yaml), as NeMo RL pins it in "
        "its Llama and Moonlight FP8 recipes since PR #3280 (vLLM 0.25 sizes a colocated KV cache "
        "up to 1.7x larger at the same gpu_memory_utilization); NeMo RL's Qwen3 file sets none"
    ),
}
_BF16_KV = (
    "BF16 KV cache: this variant is the FP8 weights-and-activations recipe; NeMo RL's FP8 KV cache "
    "is the -fp8-kvcache variant's"
)
_LLAMA_FILE = "grpo-llama3.1-8b-instruct-1n8g-megatron-fp8-rollouts.v3.yaml"
_QWEN_FILE = "grpo-qwen3-8b-base-1n8g-fp8-kvcache-megatron.yaml"

FOLLOWS: dict[str, Follows] = {
    "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8": Follows(
        _LLAMA_FILE, _LLAMA_SYNC, _LLAMA_SYNC_OLDER
    ),
    "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8-uncalibrated": Follows(
        _LLAMA_FILE, _LLAMA_SYNC, _LLAMA_SYNC_OLDER
    ),
    "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8": Follows(
        _QWEN_FILE, {**_QWEN_SYNC, "policy.generation.vllm_cfg.kv_cache_dtype": _BF16_KV}
    ),
    "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-uncalibrated": Follows(
        _QWEN_FILE, {**_QWEN_SYNC, "policy.generation.vllm_cfg.kv_cache_dtype": _BF16_KV}
    ),
    "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache": Follows(_QWEN_FILE, _QWEN_SYNC),
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
        "grpo-moonlight-16ba3b-4n8g-megatron-fp8-e2e.yaml",
        _MOONLIGHT,
        {
            "policy.generation.vllm_kwargs.kv_cache_memory_bytes": (
                "20 GiB of KV cache as NeMo RL main's file sets it (v0.7.0's sets none)"
            )
        },
    ),
}


def own_keys(path: Path) -> list[str]:
    """Leaf keys set by `path` and the recipe files it inherits: composed with NeMo RL's
    `defaults:` rule (`config.nemo_defaults.compose`), the keys whose value comes from a file in a
    `recipes/` folder (NeMo RL's base configs sit outside one)."""
    config, prov = compose(Path(path).resolve())
    return [k for k in leaves(config) if "recipes" in Path(prov.get(k, "")).parts]


def resolved_keys(upstream: dict[str, Any]) -> list[str]:
    """Every leaf key of NeMo RL's file as its loader resolves it (the base layer included)."""
    return list(leaves(upstream))


def _compared(handoff: dict[str, Any], upstream: dict[str, Any], keys: list[str]) -> list[str]:
    """`keys`, with an empty section of NeMo RL's (`vllm_kwargs: {}`) replaced by the hand-off's
    leaves under it, each then compared with NeMo RL's absent value."""
    out: list[str] = []
    for key in keys:
        theirs, ours = lookup(upstream, key), lookup(handoff, key)
        if theirs == {} and isinstance(ours, dict) and ours:
            out += [f"{key}.{sub}" for sub in leaves(ours)]
        else:
            out.append(key)
    return out


def common_reason(key: str) -> str | None:
    """The `COMMON` reason covering `key` (the key itself or a section above it)."""
    for listed, why in COMMON.items():
        if key == listed or key.startswith(listed + "."):
            return why
    return None


def mismatches(
    handoff: dict[str, Any], upstream: dict[str, Any], keys: list[str], follows: Follows
) -> list[str]:
    """Keys of NeMo RL's file whose hand-off value differs without a listed reason (the recipe's
    `deviations` or `COMMON`), and the recipe's listed deviations whose values no longer differ;
    empty when the recipe follows the file exactly."""
    out = []
    keys = _compared(handoff, upstream, keys)
    # A deviation may also be of a key NeMo RL's file does not set.
    for key in [*keys, *(k for k in follows.deviations if k not in keys)]:
        if key in DERIVED:
            continue
        ours, theirs = lookup(handoff, key), lookup(upstream, key)
        if key in follows.older:
            continue
        if key in follows.deviations:
            if ours == theirs:
                out.append(f"{key}: listed as a deviation but equal to NeMo RL's {theirs!r}")
        elif ours != theirs and common_reason(key) is None:
            shown = "<absent>" if is_missing(ours) else repr(ours)
            out.append(f"{key}: {shown} here, NeMo RL's {follows.upstream} has {theirs!r}")
    return out


def common_in_use(handoff: dict[str, Any], upstream: dict[str, Any], keys: list[str]) -> set[str]:
    """The `COMMON` entries under which this hand-off differs from NeMo RL's file."""
    used = set()
    for key in keys:
        if key not in DERIVED and lookup(handoff, key) != lookup(upstream, key):
            for listed in COMMON:
                if key == listed or key.startswith(listed + "."):
                    used.add(listed)
    return used
