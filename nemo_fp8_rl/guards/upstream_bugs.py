"""Known upstream FP8 bugs as rules, each applying while the NeMo RL tree still has the cause.

* `fp8_param` at TP > 2 (NVIDIA-NeMo/RL#1164): Megatron FP8 training with `fp8_param: true`
  and blockwise scaling at tensor parallelism above 2 gave `token_mult_prob_error` NaN from step
  2 and generations that all ran to the maximum length (a refit bug); TP = 1, `fp8_param:
  false` or tensorwise scaling were fine. Refused while NeMo RL's `Fp8Config` still carries its
  "use with caution (see .../issues/1164)" note (nemo_rl/models/policy/__init__.py: v0.7.0 and
  main 7ea279a do).
* FP8 KV cache on a model without QK-norm (verl PR #4435): Qwen2.5-Math-7B with FP8 KV cache
  scored about 0 with garbled output while Qwen3 (QK-norm) was fine; per-tensor K/V scales do
  not bound the attention logits without the norm. Warned (the outcome depends on the model)
  while NeMo RL's `init_fp8` does not look at the architecture (no QK-norm test in its fp8.py).
  QK-norm is read from `config.json`'s `model_type` (Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5,
  OLMo 2, Gemma 3 normalise q and k per head).
"""

from __future__ import annotations

from nemo_fp8_rl.guards.context import FP8_CFG, MCORE, VLLM, GuardContext
from nemo_fp8_rl.guards.findings import ERROR, WARNING, CheckResult, Finding, source_of

POLICY_INIT = "nemo_rl/models/policy/__init__.py"
FP8_PY = "nemo_rl/models/generation/vllm/quantization/fp8.py"
QK_NORM_TYPES = frozenset(
    {
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "olmo2",
        "olmoe",
        "gemma3",
        "gemma3_text",
    }
)


def _applies(ctx: GuardContext, rel: str, marker: str, present: bool) -> str | None:
    """Why the rule applies to this NeMo RL tree (None: it does not)."""
    text = ctx.nemo_rl.source(rel)
    if text is None:
        return "no NeMo RL tree to retire it against: applied"
    if (marker in text) == present:
        return f"{rel} {'still carries' if present else 'has no'} {marker!r}"
    return None


def check_fp8_param(ctx: GuardContext) -> CheckResult:
    """`fp8_param: true` + blockwise + Megatron TP > 2 (NVIDIA-NeMo/RL#1164)."""
    name = "fp8-param-tp"
    if not ctx.fp8_training:
        return CheckResult(name, "no Megatron FP8 training", skipped=True)
    why = _applies(ctx, POLICY_INIT, "issues/1164", present=True)
    if why is None:
        return CheckResult(name, f"retired: {POLICY_INIT} no longer cites issue 1164", skipped=True)
    tp = int(ctx.get(f"{MCORE}.tensor_model_parallel_size", 1))
    param, recipe = bool(ctx.get(f"{FP8_CFG}.fp8_param")), ctx.fp8_recipe
    note = f"fp8_param {param}, {recipe}, TP {tp}"
    if not (param and recipe == "blockwise" and tp > 2):
        return CheckResult(name, note)
    key = f"{FP8_CFG}.fp8_param"
    return CheckResult(
        name,
        note,
        [
            Finding(
                name,
                ERROR,
                key,
                f"fp8_param: true with blockwise FP8 at TP {tp}: token_mult_prob_error NaN from "
                "step 2 and every generation at the maximum length (a refit bug)",
                "set fp8_param: false (the shipped FP8 recipes do), or TP <= 2, or "
                "fp8_recipe: tensorwise",
                "NVIDIA-NeMo/RL#1164",
                f"NeMo RL v0.7.0 and main 7ea279a ({why})",
                source_of(ctx.provenance, key),
            )
        ],
    )


def check_kv_qk_norm(ctx: GuardContext) -> CheckResult:
    """FP8 KV cache on an architecture without QK-norm (verl PR #4435): a warning."""
    name = "fp8-kv-qk-norm"
    if not ctx.kv_fp8:
        return CheckResult(name, "no FP8 KV cache", skipped=True)
    if ctx.hf is None:
        return CheckResult(name, "no config.json for the model", skipped=True)
    why = _applies(ctx, FP8_PY, "qk_norm", present=False)
    if why is None:
        return CheckResult(name, f"retired: NeMo RL's {FP8_PY} checks QK-norm itself", skipped=True)
    model_type = str(ctx.hf.get("model_type", "?"))
    if model_type in QK_NORM_TYPES:
        return CheckResult(name, f"{model_type} normalises q and k")
    key = f"{VLLM}.kv_cache_dtype"
    return CheckResult(
        name,
        f"{model_type}: no QK-norm",
        [
            Finding(
                name,
                WARNING,
                key,
                f"FP8 KV cache on {ctx.get('policy.model_name')} ({model_type}, no QK-norm): a "
                "model without QK-norm collapsed with FP8 KV cache (Qwen2.5-Math-7B: accuracy "
                "about 0, garbled output)",
                "use kv_cache_dtype: auto for this model, or watch the run's health line "
                "(token_mult_prob_error) from step 1",
                "verl PR #4435",
                f"NeMo RL with FP8 KV cache, v0.7.0 and main 7ea279a ({why})",
                source_of(ctx.provenance, key),
            )
        ],
    )
