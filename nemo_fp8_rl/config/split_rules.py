"""Load-time rule: training and generation in different precisions only where the recipe says so.

FP8 training with BF16 generation, or BF16 training with FP8 generation, is a train/rollout
precision split: the log-probabilities the trainer computes and those the generator sampled with
come from different arithmetic, so the importance ratio and the mismatch metrics carry that gap on
every token. The field reports it as a silent failure class (trainer and rollout running
different precisions: prime-rl's ignore-pattern fix, docs/guard-rails.md), and FP8 generation
alone cost ~5 % accuracy on Llama-8B before importance-sampling correction (NeMo RL PR #971's
docs). NeMo RL accepts either split without a word. BF16 training with FP8 generation is also
NeMo RL's recommended FP8 setting on Blackwell (its FP8 page; the `-rollout` recipes, overlay
configs/precision/mxfp8-rollout.yaml), so a recipe may declare the split
(`refit.precision_split: true`); an undeclared one is refused with the key that sets each side.
The 4-bit emulation (`local.fp4`) replaces FP8 on both sides and is its own rule
(`lowprec_rules`).
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.schema import source_of

KEY = "refit.precision_split"
TRAIN = "policy.megatron_cfg.fp8_cfg.enabled"
GENERATE = "policy.generation.vllm_cfg.precision"
SOURCE = "prime-rl's ignore-pattern fix, NVIDIA-NeMo/RL PR #971"


def _get(config: dict, key: str) -> Any:
    value = lookup(config, key)
    return None if is_missing(value) else value


def precision_split(config: dict, prov: dict[str, str]) -> list[Problem]:
    """FP8 on one side of training/generation only, undeclared, is refused (module doc)."""
    train_fp8 = bool(_get(config, TRAIN))
    generate_fp8 = _get(config, GENERATE) == "fp8"
    if train_fp8 == generate_fp8 or _get(config, KEY) or _get(config, "local.fp4"):
        return []
    if train_fp8:
        key, what = GENERATE, f"FP8 training ({TRAIN}: true) with BF16 generation"
        fix = f"set {GENERATE}=fp8 (FP8 on both sides) or {TRAIN}=false"
    else:
        key, what = TRAIN, f"FP8 generation ({GENERATE}: fp8) with BF16 training"
        fix = f"set {TRAIN}=true (configs/precision/fp8-blockwise.yaml) or {GENERATE}=bfloat16"
    return [
        Problem(
            key,
            f"{what}: a train/rollout precision split, which the field reports as a silent "
            f"failure ({SOURCE})",
            f"{fix}; or, where the split is intended (NeMo RL's FP8-rollout setting), declare "
            f"it with {KEY}=true",
            source_of(prov, key),
        )
    ]
