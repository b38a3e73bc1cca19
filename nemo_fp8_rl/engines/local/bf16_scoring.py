"""Validation without the rollout-precision confound: the trained weights scored with BF16
generation.

An FP8 rollout engine scores the validation split with FP8 generation, so an FP8 recipe's
`validation/accuracy` mixes what training did to the weights with what FP8 does to generation
(at step 0, on identical weights, the two scores differ). The embedded engine therefore scores
every validation twice when the rollout is FP8: `validation/accuracy` (and `_sampled`) is the
rollout engine's own score, as NeMo RL logs it; `validation/bf16_accuracy` (and `_sampled`) is
the same weights, sent through a BF16 refit into a BF16 twin of the rollout engine, with the same
prompts, sampling settings and seed. Accuracy verdicts read the BF16 score
(`runs.scores`); with a BF16 rollout the two are the same numbers and no second pass runs.
"""

from __future__ import annotations

import copy
from typing import Any

from nemo_fp8_rl.runs.scores import (
    BF16_ACCURACY,
    BF16_ACCURACY_SAMPLED,
    ROLLOUT_ACCURACY,
    ROLLOUT_ACCURACY_SAMPLED,
)

__all__ = ["BF16_ACCURACY", "ROLLOUT_ACCURACY", "as_bf16_scores", "bf16_generation_config"]
_BF16_NAMES = {ROLLOUT_ACCURACY: BF16_ACCURACY, ROLLOUT_ACCURACY_SAMPLED: BF16_ACCURACY_SAMPLED}


def generation_is_bf16(config: dict[str, Any]) -> bool:
    """True when the recipe's rollout engine already generates in BF16 (no FP8 or 4-bit
    weights, no FP8 KV cache)."""
    vllm = config["policy"]["generation"]["vllm_cfg"]
    return (
        str(vllm.get("precision", "bfloat16")).lower() != "fp8"
        and vllm.get("kv_cache_dtype") != "fp8"
        and not (config.get("local") or {}).get("fp4")
    )


def bf16_generation_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of `config` whose rollout engine generates in BF16 (FP8 or 4-bit weights, MXFP8
    and the FP8 KV cache off)."""
    out = copy.deepcopy(config)
    vllm = out["policy"]["generation"]["vllm_cfg"]
    vllm["precision"] = "bfloat16"
    vllm["kv_cache_dtype"] = "auto"
    vllm["is_mx"] = False
    if out.get("local"):  # the 4-bit format off, with the variants that only it reads
        out["local"].update(fp4=None, fp4_activation_scale="tensor", fp4_four_over_six=False)
    return out


def as_bf16_scores(scores: dict[str, float]) -> dict[str, float]:
    """The rollout engine's validation scores under their BF16 names (for a BF16 rollout)."""
    return {_BF16_NAMES[k]: v for k, v in scores.items() if k in _BF16_NAMES}
