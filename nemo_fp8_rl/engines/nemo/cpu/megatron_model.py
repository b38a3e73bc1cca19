"""A megatron-core `GPTModel` on the CPU from a Hugging Face Qwen3 / Llama checkpoint folder.

The CPU policy worker's model: local layer spec (no Transformer Engine), TP = PP = 1,
`use_cpu_initialization`, every fusion off, FP32 parameters (the optimizer's master weights;
BF16 compute is emulated in the linear layers, `fp8_linear`). Dimensions come from the
checkpoint's `config.json`; weights are converted HF → Megatron here (fused QKV interleaved
per query group, `linear_fc1 = [gate; up]`) and back with the project's `refit.names`
mapping, so a round trip is exact.

`transformer_config` and `build_gpt` also build a Qwen3-MoE model from its transformers config
(the refit tests' Megatron model, tests/megatron_fixture.py); the worker itself loads dense
Qwen3 and Llama checkpoints only (`load_hf_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UsageError, UserError
from nemo_fp8_rl.refit.names import AttentionLayout, megatron_to_engine

SUPPORTED = ("qwen3", "llama")


def hf_rope_theta(hf: Any) -> float:
    """RoPE base of a transformers config (4.x `rope_theta`, 5.x `rope_parameters`)."""
    params = getattr(hf, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(hf, "rope_theta", 10000.0))


def load_hf_config(model_dir: str) -> Any:
    """The checkpoint's transformers config; refuses architectures the mapping does not know."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    if hf.model_type not in SUPPORTED:
        raise UsageError(
            f"policy.model_name={model_dir}",
            f"model_type {hf.model_type!r} is not supported by the CPU policy worker",
            f"use a {' or '.join(SUPPORTED)} checkpoint",
        )
    return hf


def moe_settings(hf: Any) -> dict[str, Any]:
    """`TransformerConfig` MoE fields for a Qwen3-MoE config (none for a dense model): HF's
    router softmax(top-k logits) when `norm_topk_prob` (Megatron's `pre_softmax=False`), no
    auxiliary loss, the all-gather dispatcher (one process)."""
    experts = getattr(hf, "num_experts", None)
    if not experts:
        return {}
    return {
        "num_moe_experts": experts,
        "moe_router_topk": hf.num_experts_per_tok,
        "moe_ffn_hidden_size": hf.moe_intermediate_size,
        "moe_router_pre_softmax": not getattr(hf, "norm_topk_prob", True),
        "moe_router_load_balancing_type": "none",
        "moe_token_dispatcher_type": "allgather",
        "moe_aux_loss_coeff": 0.0,
    }


def transformer_config(hf: Any, **overrides: Any) -> Any:
    """megatron-core `TransformerConfig` matching `hf` (CPU init, fusions off, FP32 params),
    with `overrides` (other `TransformerConfig` fields, e.g. `init_method_std`) on top."""
    from megatron.core.transformer import TransformerConfig

    heads = hf.num_attention_heads
    fields: dict[str, Any] = dict(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf, "num_key_value_heads", None) or heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=bool(getattr(hf, "attention_bias", False)),
        qk_layernorm=hf.model_type in ("qwen3", "qwen3_moe"),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,  # as NeMo RL's Megatron setup sets it
        params_dtype=torch.float32,
    )
    return TransformerConfig(**{**fields, **moe_settings(hf), **overrides})


def build_gpt(hf: Any, config: Any) -> torch.nn.Module:
    """An uninitialised-weights `GPTModel` with the local spec for `hf`'s architecture."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        qk_layernorm=config.qk_layernorm,
        normalization="RMSNorm",
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf.vocab_size,
        max_sequence_length=hf.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=hf_rope_theta(hf),
        share_embeddings_and_output_weights=bool(getattr(hf, "tie_word_embeddings", False)),
    )


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout):
    """HF q/k/v → Megatron's `linear_qkv` rows: per query group `[q heads | k | v]`."""
    g, d = layout.num_query_groups, layout.head_dim
    per = layout.num_attention_heads // g
    rest = tuple(q.shape[1:])
    qg = q.reshape(g, per, d, *rest)
    kg = k.reshape(g, 1, d, *rest)
    vg = v.reshape(g, 1, d, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(g * (per + 2) * d, *rest)


_LAYER_RENAME = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


def hf_to_megatron(state: dict[str, torch.Tensor], hf: Any) -> dict[str, torch.Tensor]:
    """A transformers state dict as the local-spec `GPTModel`'s parameter names."""
    layout = AttentionLayout.from_hf_config(hf)
    out = {
        "embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": state["model.norm.weight"],
    }
    if not getattr(hf, "tie_word_embeddings", False):
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(hf.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_name, mg_name in _LAYER_RENAME.items():
            if src + hf_name in state:
                out[dst + mg_name] = state[src + hf_name]
        for kind in ("weight", "bias"):
            q = state.get(f"{src}self_attn.q_proj.{kind}")
            if q is not None:
                k, v = (
                    state[f"{src}self_attn.k_proj.{kind}"],
                    state[f"{src}self_attn.v_proj.{kind}"],
                )
                out[f"{dst}self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, layout)
        gate, up = state[f"{src}mlp.gate_proj.weight"], state[f"{src}mlp.up_proj.weight"]
        out[f"{dst}mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
    return out


def read_hf_state(model_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files, FP32, by HF name."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise UserError(
            f"policy.model_name={model_dir}",
            "no *.safetensors files",
            "point it at a Hugging Face checkpoint folder saved with safe_serialization",
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update({k: v.to(torch.float32) for k, v in load_file(str(f)).items()})
    return state


def load_into(model: torch.nn.Module, named: dict[str, torch.Tensor]) -> None:
    """Copy `named` into `model`'s parameters; every parameter must be given, shapes equal."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(named))
    unknown = sorted(set(named) - set(params))
    if missing or unknown:
        raise UsageError(
            "HF → Megatron conversion",
            f"missing {missing[:4]}, unknown {unknown[:4]}",
            "use a Qwen3/Llama checkpoint whose config.json matches its weights",
        )
    with torch.no_grad():
        for name, p in params.items():
            src = named[name]
            if tuple(src.shape) != tuple(p.shape):
                raise UsageError(
                    name,
                    f"checkpoint shape {tuple(src.shape)} != model {tuple(p.shape)}",
                    "config.json and the weights disagree",
                )
            p.copy_(src)


def hf_named_weights(model: torch.nn.Module, config: Any, dtype: torch.dtype):
    """The model's weights under HF checkpoint names (as NeMo RL's Megatron worker exports them
    for vLLM), in `dtype`, one tensor at a time. A tied LM head is exported once (embeddings)."""
    layout = AttentionLayout.from_megatron_config(config)
    named = ((n, p.detach()) for n, p in model.named_parameters())
    for name, tensor in megatron_to_engine(named, layout):
        yield name, tensor.to(dtype)
