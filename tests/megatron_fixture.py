"""A tiny megatron-core `GPTModel` on CPU, and the transformers config that matches it.

megatron-core assumes CUDA in two places that a CPU forward reaches: `torch.cuda.current_device()`
(rotary embeddings, memory buffers, MoE router) and the CUDA RNG tracker's `fork()` around
attention dropout. A third gap is MoE-only: without Transformer Engine, megatron-core 0.16.1's
`moe_utils` never defines `te_general_gemm` but the router's gating GEMM tests it, raising
NameError; binding it to None selects the plain `torch.mm` branch that is already there.
`cpu_megatron()` applies exactly these for the duration of a test and restores them afterwards;
nothing outside this fixture patches megatron-core or torch.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

Arch = Literal["llama", "qwen3", "qwen3_moe"]


@dataclass(frozen=True)
class TinyGPT:
    """Dimensions shared by the Megatron model and its transformers twin."""

    arch: Arch = "qwen3"
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int = 2
    kv_channels: int = 16
    ffn_hidden_size: int = 96
    vocab_size: int = 256
    num_experts: int = 4
    moe_topk: int = 2
    moe_ffn_hidden_size: int = 32
    max_position_embeddings: int = 64
    rotary_base: int = 10000
    norm_eps: float = 1e-6


@contextlib.contextmanager
def cpu_megatron() -> Iterator[None]:
    """Single-process gloo group, model-parallel state of size 1, and the two CPU patches."""
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core import parallel_state

    tracker = mrandom.get_cuda_rng_tracker()
    saved_device, saved_fork = torch.cuda.current_device, tracker.fork
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    tracker.fork = lambda name=None: contextlib.nullcontext()  # type: ignore[method-assign]
    gemm_missing = not hasattr(moe_utils, "te_general_gemm")
    if gemm_missing:
        moe_utils.te_general_gemm = None
    owns_group = not torch.distributed.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if owns_group:
                torch.distributed.init_process_group(
                    "gloo", init_method=f"file://{os.path.join(tmp, 'pg')}", world_size=1, rank=0
                )
            parallel_state.initialize_model_parallel(1, 1)
            yield
        finally:
            parallel_state.destroy_model_parallel()
            if owns_group:
                torch.distributed.destroy_process_group()
            torch.cuda.current_device = saved_device  # type: ignore[assignment]
            tracker.fork = saved_fork  # type: ignore[method-assign]
            if gemm_missing:
                del moe_utils.te_general_gemm


def build_megatron_gpt(dims: TinyGPT, seed: int = 0) -> torch.nn.Module:
    """A megatron-core GPTModel (local spec, RMSNorm, SwiGLU, RoPE, GQA) in FP32 on CPU, built
    from `hf_config(dims)` by the CPU policy worker's builder (`cpu.megatron_model`).

    Must be called inside `cpu_megatron()`. Weights are random but not the init defaults: norms
    get random gains so that a mapping mistake on them changes the logits.
    """
    from nemo_fp8_rl.engines.nemo.cpu import megatron_model

    hf = hf_config(dims)
    config = megatron_model.transformer_config(hf, init_method_std=0.05)
    torch.manual_seed(seed)
    model = megatron_model.build_gpt(hf, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def megatron_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Causal-LM logits [batch, seq, vocab] of a Megatron GPTModel on `tokens` [batch, seq]."""
    batch, seq = tokens.shape
    position_ids = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        return model(tokens, position_ids, mask)


def hf_config(dims: TinyGPT):
    """The transformers config of the model the Megatron one is converted into."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_query_groups,
        head_dim=dims.kv_channels,
        max_position_embeddings=dims.max_position_embeddings,
        rms_norm_eps=dims.norm_eps,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(dims.rotary_base)},
    )
    if dims.arch == "llama":
        return LlamaConfig(intermediate_size=dims.ffn_hidden_size, mlp_bias=False, **common)
    if dims.arch == "qwen3":
        return Qwen3Config(intermediate_size=dims.ffn_hidden_size, **common)
    return Qwen3MoeConfig(
        intermediate_size=dims.ffn_hidden_size,
        moe_intermediate_size=dims.moe_ffn_hidden_size,
        num_experts=dims.num_experts,
        num_experts_per_tok=dims.moe_topk,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        **common,
    )
