"""Per-GPU memory of a recipe: the Megatron trainer's rank and the vLLM engine's rank, in GiB.

Trainer (the first pipeline stage, which holds the embedding and the most in-flight
micro-batches; the last stage's output layer and logits are counted when PP = 1):

* parameters: BF16, 2 B each, dense weights split by TP (and PP), routed experts by EP x ETP;
* gradients: Megatron's DDP buffer, 2 B (4 B with `grad_reduce_in_fp32`);
* optimizer: FP32 master weights and Adam's two moments, 12 B (8 B with the precision-aware
  optimizer, BF16 moments), divided by the data-parallel size with the distributed optimizer;
* FP8 copies: Transformer Engine's cached FP8 weight and its transpose, 2 B per GEMM weight
  (`fp8_param: false`; MXFP8 adds 2/32 B of E8M0 scales);
* activations (Korthikanti et al. 2022, flash attention, per token and layer): the inputs each
  layer saves for backward, GEMM inputs in FP8 (1 B) when training in FP8, the rest BF16; split
  by TP inside attention and MLP, also outside with sequence parallelism, and by CP; a micro-batch
  is `sequence_packing.train_mb_tokens` tokens (else `train_micro_batch_size x
  max_total_sequence_length`); the first stage holds PP micro-batches at once (1F1B). Full
  activation checkpointing keeps each layer's 2 B x hidden input plus one layer's activations;
* logits: FP32 vocab-parallel logits and their softmax gradient, 8 B per token and vocab/TP;
* overhead: 4 GiB (CUDA context, NCCL and cuBLAS workspaces, allocator slack), a fixed guess.

vLLM (one rank of one engine):

* weights: GEMM weights in rollout precision split by vLLM's TP (experts by its EP): FP8 1 B
  plus FP32 scales per 128x128 block (MXFP8: 1 + 1/32 B), BF16 2 B for the layers kept BF16
  and for the embedding and LM head;
* KV cache: `vllm_kwargs.kv_cache_memory_bytes` when set, else what vLLM's profiler leaves:
  `gpu_memory_utilization x GPU memory - weights - overhead`;
* overhead: 1 GiB outside torch (CUDA context, NCCL), the profiling peak of one
  `max_num_batched_tokens` = 16,384-token batch through the largest MLP (gate/up output, BF16)
  plus FP32 logits of 256 sequences, and 0.5 GiB of CUDA graphs unless `enforce_eager`.

docs/guard-rails.md compares these with every published figure found and states the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nemo_fp8_rl.guards.context import FP8_CFG, MCORE, VLLM, get_key
from nemo_fp8_rl.guards.model_shapes import (
    Gemm,
    decoder_gemms,
    embedding_params,
    moe_layer_count,
    num_experts,
)

GIB = 1024**3
TRAIN_OVERHEAD_GIB = 4.0
VLLM_NON_TORCH_GIB = 1.0
VLLM_GRAPHS_GIB = 0.5
VLLM_BATCH_TOKENS = 16_384
VLLM_MAX_SEQS = 256
BLOCK = 128


@dataclass(frozen=True)
class Part:
    """One line of a breakdown: what, GiB, and how it was counted."""

    name: str
    gib: float
    how: str


def _stage_layers(cfg: dict[str, Any], layers: int) -> int:
    pp = int(get_key(cfg, f"{MCORE}.pipeline_model_parallel_size", 1))
    first = get_key(cfg, f"{MCORE}.num_layers_in_first_pipeline_stage")
    return int(first) if first else math.ceil(layers / pp)


def _rank_weights(
    gemms: list[Gemm], tp: int, ep: int, etp: int, share: float
) -> tuple[float, float]:
    """(dense, expert) GEMM parameters one rank holds for `share` of the decoder layers."""
    dense = expert = 0.0
    for g in gemms:
        o, i = g.shard(tp, etp)
        if g.expert:
            expert += o * i * g.per_layer / ep * g.layers * share
        else:
            dense += o * i * g.layers * share
    return dense, expert


def _act_bytes_per_token(hf: dict[str, Any], cfg: dict[str, Any], fp8: bool) -> float:
    """Bytes one layer saves per token for backward (no recompute), on one TP/SP rank."""
    tp = int(get_key(cfg, f"{MCORE}.tensor_model_parallel_size", 1))
    sp = bool(get_key(cfg, f"{MCORE}.sequence_parallel")) and tp > 1
    etp = int(get_key(cfg, f"{MCORE}.expert_tensor_parallel_size", 1) or 1)
    h, g_in = int(hf["hidden_size"]), 1 if fp8 else 2
    outside = (2 * 2 * h + 2 * g_in * h) / (tp if sp else 1)  # residuals + the two norm outputs
    inside, layers = 0.0, int(hf["num_hidden_layers"])
    by_name = {g.name: g for g in decoder_gemms(hf)}
    for name, g in by_name.items():
        if g.expert or name.startswith("shared_experts"):
            continue
        o, _ = g.shard(tp, etp)
        share = g.layers / layers  # dense MLPs sit in a MoE model's first layers only
        if g.split == "row":
            inside += share * g_in * g.inp / tp  # the GEMM's saved input
        else:
            inside += share * 2 * o  # a column or duplicated GEMM's BF16 output (q/k/v, gate/up)
    if num_experts(hf):
        top_k = int(hf.get("num_experts_per_tok") or 1)
        inter = int(hf.get("moe_intermediate_size") or hf["intermediate_size"])
        share = moe_layer_count(hf) / layers
        routed = top_k * (g_in * h + 2 * 2 * inter / etp + g_in * inter / etp) + 4 * num_experts(hf)
        inside += share * routed
        shared = by_name.get("shared_experts.linear_fc2")
        if shared is not None:
            inside += share * (2 * 2 + g_in) * shared.inp / tp
    return outside + inside


def trainer_parts(cfg: dict[str, Any], hf: dict[str, Any], world: int) -> list[Part]:
    """The trainer rank's memory (module docstring), for `world` training GPUs."""
    tp = int(get_key(cfg, f"{MCORE}.tensor_model_parallel_size", 1))
    pp = int(get_key(cfg, f"{MCORE}.pipeline_model_parallel_size", 1))
    cp = int(get_key(cfg, f"{MCORE}.context_parallel_size", 1))
    ep = int(get_key(cfg, f"{MCORE}.expert_model_parallel_size", 1))
    etp = int(get_key(cfg, f"{MCORE}.expert_tensor_parallel_size", 1) or 1)
    layers = int(hf["num_hidden_layers"])
    stage = _stage_layers(cfg, layers)
    dense, expert = _rank_weights(decoder_gemms(hf), tp, ep, etp, stage / layers)
    emb, head = embedding_params(hf)
    emb_rank = (emb + (head if pp == 1 else 0)) / tp
    params = dense + expert + emb_rank
    dp = max(1, world // (tp * pp * cp))
    edp = max(1, world // (ep * etp * pp))
    fp8 = bool(get_key(cfg, f"{FP8_CFG}.enabled"))
    opt = get_key(cfg, f"{MCORE}.optimizer") or {}
    opt_b = 8 if opt.get("use_precision_aware_optimizer") else 12
    dist = bool(opt.get("use_distributed_optimizer", True))
    grad_b = (
        4 if get_key(cfg, f"{MCORE}.distributed_data_parallel_config.grad_reduce_in_fp32") else 2
    )
    optim = opt_b * ((dense + emb_rank) / (dp if dist else 1) + expert / (edp if dist else 1))
    parts = [
        Part(
            "parameters",
            2 * params / GIB,
            f"{params / 1e9:.2f}e9 params x 2 B (BF16), {stage} of {layers} layers, TP {tp}, EP {ep}",
        ),
        Part("gradients", grad_b * params / GIB, f"DDP buffer {grad_b} B/param"),
        Part(
            "optimizer",
            optim / GIB,
            f"{opt_b} B/param over DP {dp if dist else 1} (experts {edp if dist else 1})",
        ),
    ]
    if fp8:
        recipe = get_key(cfg, f"{FP8_CFG}.fp8_recipe", "blockwise")
        per = 2 + (2 / 32 if recipe == "mxfp8" else 0)
        parts.append(
            Part(
                "FP8 weight copies",
                per * (dense + expert) / GIB,
                f"{per:g} B per GEMM weight ({recipe}, fp8_param false)",
            )
        )
    tokens = _mb_tokens(cfg) / cp
    per_layer = _act_bytes_per_token(hf, cfg, fp8)
    sp = bool(get_key(cfg, f"{MCORE}.sequence_parallel")) and tp > 1
    if get_key(cfg, f"{MCORE}.activation_checkpointing"):
        h = int(hf["hidden_size"])
        act = tokens * (stage * 2 * h / (tp if sp else 1) + per_layer) * min(pp, 2)
        how = f"{tokens:.0f} tokens/micro-batch/CP, full recompute: 2 B x hidden per layer + one layer"
    else:
        act = tokens * per_layer * stage * pp
        how = f"{tokens:.0f} tokens/micro-batch/CP x {per_layer:.0f} B/token/layer x {stage} layers x {pp} in flight"
    parts.append(Part("activations", act / GIB, how))
    if pp == 1:
        vocab = int(hf["vocab_size"]) / tp
        parts.append(
            Part(
                "logits",
                tokens * vocab * 8 / GIB,
                f"{tokens:.0f} tokens x {vocab:.0f} vocab/TP x 8 B (FP32 + grad)",
            )
        )
    parts.append(
        Part("overhead", TRAIN_OVERHEAD_GIB, "CUDA context, NCCL, workspaces (fixed guess)")
    )
    return parts


def _mb_tokens(cfg: dict[str, Any]) -> float:
    if get_key(cfg, "policy.sequence_packing.enabled"):
        return float(get_key(cfg, "policy.sequence_packing.train_mb_tokens"))
    if get_key(cfg, "policy.dynamic_batching.enabled"):
        return float(get_key(cfg, "policy.dynamic_batching.train_mb_tokens"))
    return float(get_key(cfg, "policy.train_micro_batch_size", 1)) * float(
        get_key(cfg, "policy.max_total_sequence_length")
    )


def _bf16_layer(cfg: dict[str, Any], hf: dict[str, Any], name: str) -> bool:
    """Whether NeMo RL's init_fp8 keeps GEMM `name` BF16 (`quantization_ignored_layer_kws`:
    substrings of HF module names; MLA's `kv_a_proj`/`kv_b_proj` for `[a_proj, b_proj]`)."""
    kws = get_key(cfg, f"{VLLM}.quantization_ignored_layer_kws") or []
    hf_names = {
        "linear_q_down_proj": "q_a_proj",
        "linear_q_up_proj": "q_b_proj",
        "linear_kv_down_proj": "kv_a_proj_with_mqa",
        "linear_kv_up_proj": "kv_b_proj",
    }
    return any(k in hf_names.get(name, name) for k in kws)


def vllm_weights(cfg: dict[str, Any], hf: dict[str, Any]) -> tuple[float, str]:
    """(bytes of one vLLM rank's weights, how)."""
    tp = int(get_key(cfg, f"{VLLM}.tensor_parallel_size", 1))
    ep = int(get_key(cfg, f"{VLLM}.expert_parallel_size", 1))
    fp8 = get_key(cfg, f"{VLLM}.precision") == "fp8"
    mx = fp8 and bool(get_key(cfg, f"{VLLM}.is_mx"))
    layers = int(hf["num_hidden_layers"])
    bf16_layers = int(get_key(cfg, f"{VLLM}.num_first_layers_in_bf16", 0)) + int(
        get_key(cfg, f"{VLLM}.num_last_layers_in_bf16", 0)
    )
    total = 0.0
    for g in decoder_gemms(hf):
        n = g.out * g.inp * g.per_layer * g.layers / (tp * ep if g.expert else tp)
        quantized = fp8 and not _bf16_layer(cfg, hf, g.name)
        if not quantized:
            total += 2 * n
            continue
        per = 1 + (1 / 32 if mx else 4 / (BLOCK * BLOCK))
        share_bf16 = bf16_layers / layers
        total += n * (per * (1 - share_bf16) + 2 * share_bf16)
    emb, head = embedding_params(hf)
    total += 2 * (emb + head) / tp
    what = "MXFP8" if mx else ("FP8 block" if fp8 else "BF16")
    return total, f"GEMMs {what}, embeddings BF16, vLLM TP {tp}" + (f", EP {ep}" if ep > 1 else "")


def vllm_overhead(cfg: dict[str, Any], hf: dict[str, Any]) -> tuple[float, str]:
    """(bytes outside weights and KV cache, how): non-torch, profiling peak, CUDA graphs."""
    tp = int(get_key(cfg, f"{VLLM}.tensor_parallel_size", 1))
    widest = max(
        (g.out for g in decoder_gemms(hf) if g.name.endswith("fc1") and not g.expert), default=0
    )
    if num_experts(hf):
        inter = int(hf.get("moe_intermediate_size") or hf["intermediate_size"])
        widest = max(widest, 2 * inter * int(hf.get("num_experts_per_tok") or 1))
    peak = (
        VLLM_BATCH_TOKENS * 2 * widest * 1.5 / tp
        + VLLM_MAX_SEQS * int(hf["vocab_size"]) * 4 * 2 / tp
    )
    graphs = 0.0 if get_key(cfg, f"{VLLM}.enforce_eager") else VLLM_GRAPHS_GIB * GIB
    total = VLLM_NON_TORCH_GIB * GIB + peak + graphs
    return (
        total,
        f"{VLLM_NON_TORCH_GIB:g} GiB non-torch + {peak / GIB:.2f} GiB profile peak + {graphs / GIB:g} GiB CUDA graphs",
    )


def kv_bytes_per_token(cfg: dict[str, Any], hf: dict[str, Any]) -> float:
    """KV-cache bytes per token on one vLLM rank (MLA caches the latent once per layer)."""
    tp = int(get_key(cfg, f"{VLLM}.tensor_parallel_size", 1))
    elem = 1 if str(get_key(cfg, f"{VLLM}.kv_cache_dtype", "auto")).startswith("fp8") else 2
    layers = int(hf["num_hidden_layers"])
    if hf.get("kv_lora_rank"):
        return layers * (int(hf["kv_lora_rank"]) + int(hf["qk_rope_head_dim"])) * elem
    heads = int(hf["num_attention_heads"])
    kv = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    return layers * 2 * max(1, kv // tp) * head_dim * elem


def vllm_parts(cfg: dict[str, Any], hf: dict[str, Any], memory_gib: float) -> list[Part]:
    """The vLLM rank's memory (module docstring) on a GPU of `memory_gib`."""
    weights, how_w = vllm_weights(cfg, hf)
    overhead, how_o = vllm_overhead(cfg, hf)
    pinned = (get_key(cfg, "policy.generation.vllm_kwargs") or {}).get("kv_cache_memory_bytes")
    if pinned:
        kv, how_kv = float(pinned), "vllm_kwargs.kv_cache_memory_bytes"
    else:
        util = float(get_key(cfg, f"{VLLM}.gpu_memory_utilization", 0.9))
        kv = max(0.0, util * memory_gib * GIB - weights - overhead)
        how_kv = f"gpu_memory_utilization {util:g} x {memory_gib:.1f} GiB - weights - overhead"
    tokens = kv / kv_bytes_per_token(cfg, hf)
    return [
        Part("weights", weights / GIB, how_w),
        Part("KV cache", kv / GIB, f"{how_kv} ({tokens:,.0f} tokens)"),
        Part("overhead", overhead / GIB, how_o),
    ]
