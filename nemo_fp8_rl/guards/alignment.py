"""Transformer Engine's FP8 divisibility rules, for every FP8 GEMM of the model and the tokens.

Read from Transformer Engine v2.15 (the release NeMo RL pins, `release_v2.15`; unchanged at
main d0067d0):

* every FP8 recipe (tensorwise, blockwise): `assert_dim_for_fp8_exec`
  (transformer_engine/pytorch/utils.py:510) on the local input `[tokens, in]` and the weight
  `[out, in]` of each `Linear`/`LayerNormLinear`/`LayerNormMLP` (linear.py:179,
  layernorm_linear.py:166, layernorm_mlp.py:348): the product of the leading dims % 8 and the
  last dim % 16; with sequence parallelism the input is the rank's shard, before the all-gather.
  cuBLASLt's FP8 GEMMs (common/gemm/cublaslt_gemm.cu:161, 209-213, 252, 295-299) need the
  leading dimensions % 16 and m, n % 8; over the forward (k = in), data-gradient (k = out) and
  weight-gradient (k = tokens) GEMMs that is `in`, `out` and the GEMM's tokens all % 16.
* MXFP8: `MXFP8Quantizer::create_tensor` (pytorch/csrc/quantizer.cpp:1350) needs both dims of
  every quantized tensor % 32: `in`, `out`, and the tokens of each rank.

Tokens per GEMM, for the recipe's Megatron parallelism (TP, SP, CP; EP splits experts, ETP their
FFN): with sequence packing NeMo RL pads each packed micro-batch to a multiple of
`divisor x 2CP (CP > 1) x TP (SP)`, divisor 128 blockwise / 32 MXFP8 / 16 otherwise
(`nemo_rl/models/megatron/data.py`, `_get_pack_sequence_parameters_for_megatron`), which meets
the rules. Without packing a micro-batch of `b` sequences is padded to a multiple `m` of
`policy.make_sequence_length_divisible_by`, split by CP and, with SP, by TP: every length `k m`
meets a rule of `a` only when `b m / (CP TP_sp)` is a multiple of `a`. With dynamic batching or
dynamic sampling `b` can be 1. Routed-expert token counts follow the router, not the recipe.
"""

from __future__ import annotations

import math

from nemo_fp8_rl.guards.context import MCORE, GuardContext
from nemo_fp8_rl.guards.findings import ERROR, CheckResult, Finding, source_of
from nemo_fp8_rl.guards.model_shapes import decoder_gemms

CHECK = "alignment"
UPSTREAM = "NVIDIA-NeMo/RL#1551; ms-swift#9723; verl#5440, #5989"
APPLIES = "every NeMo RL version with Megatron FP8 training (v0.7.0, main 7ea279a; TE v2.15)"
TE = "Transformer Engine v2.15"
DIM_CITE = {
    "mxfp8": "pytorch/csrc/quantizer.cpp:1350 (MXFP8Quantizer::create_tensor)",
    "other": "pytorch/utils.py:510 (assert_dim_for_fp8_exec), common/gemm/cublaslt_gemm.cu:209-213",
}


def dim_rule(recipe: str) -> int:
    """What every GEMM dimension (in, out, tokens) must divide by: 32 MXFP8, 16 otherwise."""
    return 32 if recipe == "mxfp8" else 16


def local_token_rule(recipe: str) -> int:
    """What a rank's input rows must divide by: 32 MXFP8, 8 otherwise (the forward assert)."""
    return 32 if recipe == "mxfp8" else 8


def _weight_findings(ctx: GuardContext, recipe: str) -> list[Finding]:
    tp = int(ctx.get(f"{MCORE}.tensor_model_parallel_size", 1))
    etp = int(ctx.get(f"{MCORE}.expert_tensor_parallel_size", 1) or 1)
    rule, out = dim_rule(recipe), []
    for gemm in decoder_gemms(ctx.hf or {}):
        t = etp if gemm.expert else tp
        o, i = gemm.shard(tp, etp)
        split = gemm.out if gemm.split == "column" else gemm.inp
        if gemm.split != "duplicated" and split % t:
            continue  # not shardable at all: Megatron refuses it itself
        bad = [(n, v) for n, v in (("out", o), ("in", i)) if v % rule]
        if not bad:
            continue
        key = f"{MCORE}.{'expert_tensor_parallel_size' if gemm.expert else 'tensor_model_parallel_size'}"
        par = "ETP" if gemm.expert else "TP"
        dims = ", ".join(f"{n} = {v}" for n, v in bad)
        ok = [
            d
            for d in (1, 2, 4, 8, 16)
            if gemm.split == "duplicated" or (split % d == 0 and (split // d) % rule == 0)
        ]
        out.append(
            Finding(
                f"{CHECK}/gemm",
                ERROR,
                key,
                f"{gemm.name} weight shard [{o}, {i}] at {par} {t} ({gemm.split}-parallel): {dims} "
                f"not a multiple of {rule} ({TE} {DIM_CITE['mxfp8' if recipe == 'mxfp8' else 'other']})",
                f"use {par} in {ok}"
                if ok
                else "this GEMM cannot run in FP8 with this recipe: use BF16",
                UPSTREAM,
                APPLIES,
                source_of(ctx.provenance, key),
            )
        )
    return out


def token_multiple(ctx: GuardContext, recipe: str) -> tuple[int, int, int, str] | None:
    """Without packing: (the multiple `make_sequence_length_divisible_by` needs, sequences per
    micro-batch `b`, ranks a sequence is split over, what decided it); None when sequence
    packing pads for Transformer Engine already."""
    if ctx.get("policy.sequence_packing.enabled"):
        return None
    tp = int(ctx.get(f"{MCORE}.tensor_model_parallel_size", 1))
    cp = int(ctx.get(f"{MCORE}.context_parallel_size", 1))
    sp = bool(ctx.get(f"{MCORE}.sequence_parallel")) and tp > 1
    varying = ctx.get("policy.dynamic_batching.enabled") or ctx.get("grpo.use_dynamic_sampling")
    b = (
        1
        if varying
        else min(
            int(ctx.get("policy.train_micro_batch_size", 1)),
            int(ctx.get("policy.logprob_batch_size", 1)),
        )
    )
    split = cp * (tp if sp else 1)
    need = math.lcm(split * local_token_rule(recipe), cp * dim_rule(recipe))
    why = (
        f"{'dynamic batching/sampling: down to 1' if varying else b} sequence(s) per micro-batch, "
        f"CP {cp}, {'SP over TP ' + str(tp) if sp else 'no SP'}; a rank's input rows % "
        f"{local_token_rule(recipe)} and each GEMM's tokens % {dim_rule(recipe)}"
    )
    return need // math.gcd(need, b), b, split, why


def _token_findings(ctx: GuardContext, recipe: str) -> list[Finding]:
    found = token_multiple(ctx, recipe)
    if found is None:
        return []
    need, b, split, why = found
    key = "policy.make_sequence_length_divisible_by"
    m = int(ctx.get(key, 1))
    if m % need == 0:
        return []
    rows = b * m / split  # a sequence padded to m itself already breaks a rule (k = 1)
    return [
        Finding(
            f"{CHECK}/tokens",
            ERROR,
            key,
            f"{m}: {TE} refuses FP8 GEMMs on sequences padded to a multiple of {m} ({why}): "
            f"{b} sequence(s) padded to {m} tokens give {rows:g} rows on a rank "
            f"({DIM_CITE['mxfp8' if recipe == 'mxfp8' else 'other']})",
            f"set {key}: {need} (or a multiple of it), or enable policy.sequence_packing (NeMo RL "
            "then pads for FP8 itself)",
            UPSTREAM,
            APPLIES,
            source_of(ctx.provenance, key),
        )
    ]


def check(ctx: GuardContext) -> CheckResult:
    """Refuse FP8 training whose GEMM shards or token counts break TE's divisibility rules."""
    if not ctx.fp8_training:
        return CheckResult(CHECK, "no Megatron FP8 training", skipped=True)
    if ctx.hf is None:
        return CheckResult(CHECK, "no config.json for the model", skipped=True)
    recipe = ctx.fp8_recipe or "blockwise"
    findings = _weight_findings(ctx, recipe) + _token_findings(ctx, recipe)
    gemms = len(decoder_gemms(ctx.hf))
    tokens = "packed: NeMo RL pads" if ctx.get("policy.sequence_packing.enabled") else "padded"
    note = f"{recipe}: {gemms} GEMM kinds, dims % {dim_rule(recipe)}; tokens {tokens}"
    return CheckResult(CHECK, note, findings)
