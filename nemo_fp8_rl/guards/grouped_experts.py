"""Grouped MoE expert slabs in an MXFP8 refit: NeMo RL 7ea279a's `load_weights` refuses them.

At main 7ea279a, `nemo_rl/models/generation/vllm/quantization/fp8.py` `load_weights`
(lines 482-508) takes a refit tensor named `...mlp.experts.gate_up_proj` or
`...mlp.experts.down_proj` (a grouped slab of every expert), and when vLLM holds that layer's
experts in FP8 with `is_mx` it raises `NotImplementedError("MXFP8 refit does not support grouped
MoE expert weights.")` at the first refit. Per-expert names (`...mlp.experts.<e>.gate_proj.weight`)
take the other path: `_is_fp8_weight` finds the `RoutedExperts` module (lines 437-454),
`quantize_mxfp8_weight` quantizes each expert and vLLM loads its `w13/w2_weight_scale_from_
checkpoint` (lines 1242-1259, FlashInfer TRTLLM only, line 1202).

Which names the refit sends depends on the trainer, never on the rollout:

* Megatron (`policy.megatron_cfg.enabled`): Megatron-Bridge's bridge for the model names the
  HF tensors. At the commit 7ea279a pins (Megatron-Bridge 8c46dc4), `qwen3_moe_bridge.py`
  (lines 106-125) maps the grouped experts to per-expert names
  (`model.layers.*.mlp.experts.*.gate_proj.weight`), as the DeepSeek-V3 bridge does; the bridges
  with `FusedExpertMapping` (Qwen3.5-MoE with packed checkpoints, GLM-4.5, Gemma 4) send slabs.
* DTensor (Megatron off): the transformers model's own parameter names, which transformers 5
  (NeMo RL 7ea279a pins >= 5.5) holds as grouped slabs for Qwen3-MoE and Qwen3.5-MoE.

So the Qwen3-30B-A3B MXFP8 recipes (Megatron) refit per expert and run on 7ea279a; the same
model trained with DTensor would stop at its first refit. The check refuses that before launch,
unless the rollout keeps the experts in BF16 (`quantization_ignored_layer_kws` matching
`mlp.experts`: vLLM then builds them unquantized and the slab passes through in BF16, lines
488-507). It retires itself on a NeMo RL whose fp8.py no longer raises.
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.guards.context import MCORE, VLLM, GuardContext
from nemo_fp8_rl.guards.findings import ERROR, CheckResult, Finding, source_of

CHECK = "grouped-experts-mxfp8"
FP8_PY = "nemo_rl/models/generation/vllm/quantization/fp8.py"
MARKER = "MXFP8 refit does not support grouped MoE expert weights"
UPSTREAM = "NeMo RL 7ea279a fp8.py load_weights; Megatron-Bridge 8c46dc4 qwen3_moe_bridge.py"
# model types whose pinned Megatron-Bridge bridge maps experts with FusedExpertMapping (slabs)
FUSED_BRIDGES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text", "glm4_moe", "gemma4"})
# model types transformers 5 builds with grouped expert parameters
GROUPED_IN_TRANSFORMERS = frozenset({"qwen3_moe", "qwen3_5_moe", "qwen3_5_moe_text"})


def has_experts(hf: dict[str, Any] | None) -> bool:
    """Whether the model has routed experts (`num_experts` or `n_routed_experts` > 0)."""
    hf = hf or {}
    return bool(hf.get("num_experts") or hf.get("n_routed_experts"))


def trainer_sends_grouped(hf: dict[str, Any], megatron: bool) -> bool:
    """Whether the trainer's refit names the experts as grouped slabs (module docstring)."""
    model_type = str(hf.get("model_type", ""))
    return model_type in (FUSED_BRIDGES if megatron else GROUPED_IN_TRANSFORMERS)


def experts_kept_bf16(vllm_cfg_kws: list[str]) -> bool:
    """Whether NeMo RL's `init_fp8` puts both expert slabs of a layer in `ignored_layers` (each
    name holds one of the keywords as a substring, as it matches)."""
    slabs = ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj")
    return all(any(kw and kw in name for kw in vllm_cfg_kws) for name in slabs)


def check(ctx: GuardContext) -> CheckResult:
    """Refuse an MXFP8 rollout whose refit would send grouped expert slabs vLLM holds in FP8."""
    if not ctx.is_mx:
        return CheckResult(CHECK, "no MXFP8 rollout (is_mx)", skipped=True)
    if ctx.hf is None:
        return CheckResult(CHECK, "no config.json for the model", skipped=True)
    if not has_experts(ctx.hf):
        return CheckResult(CHECK, "no routed experts")
    text = ctx.nemo_rl.source(FP8_PY)
    if text is not None and MARKER not in text:
        return CheckResult(
            CHECK, f"retired: {FP8_PY} refits grouped experts in MXFP8", skipped=True
        )
    megatron = bool(ctx.get(f"{MCORE}.enabled"))
    trainer = "Megatron-Bridge" if megatron else "the transformers model (DTensor)"
    model_type = ctx.hf.get("model_type")
    if not trainer_sends_grouped(ctx.hf, megatron):
        return CheckResult(CHECK, f"{trainer} names {model_type}'s experts one by one")
    kws = list(ctx.get(f"{VLLM}.quantization_ignored_layer_kws") or [])
    if experts_kept_bf16(kws):
        return CheckResult(CHECK, f"grouped slabs, kept BF16 in the rollout ({kws})")
    key = f"{VLLM}.is_mx"
    line = _line(text)
    finding = Finding(
        CHECK,
        ERROR,
        key,
        f"{trainer} sends {model_type}'s experts as grouped slabs (mlp.experts.gate_up_proj, "
        f"down_proj) and vLLM holds them in MXFP8: NeMo RL's load_weights raises "
        f"NotImplementedError ('{MARKER}', {FP8_PY}{line}) at the first refit",
        f"keep the experts BF16 in the rollout ({VLLM}.quantization_ignored_layer_kws: "
        "['mlp.experts']), train with Megatron (policy.megatron_cfg.enabled: true; its "
        "Qwen3-MoE bridge sends experts one by one), or is_mx: false (block FP8 refits slabs)",
        UPSTREAM,
        "NeMo RL main 7ea279a (v0.7.0 has no is_mx)",
        source_of(ctx.provenance, key),
    )
    return CheckResult(CHECK, f"{trainer}: grouped slabs", [finding])


def _line(text: str | None) -> str:
    """`:<line>` of the refusal in NeMo RL's fp8.py ('' without the tree)."""
    if text is None:
        return ""
    return f":{text[: text.index(MARKER)].count(chr(10)) + 1}"
