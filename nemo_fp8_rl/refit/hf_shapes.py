"""The weights a refit streams, by HF name and shape, derived from a model's `config.json`.

NeMo RL's Megatron worker exports HF-named tensors (`model.layers.<i>.self_attn.q_proj.weight`,
...); this lists them for the decoder-only families the refit path covers (Llama, Qwen2, Qwen3,
Qwen3-MoE) without any checkpoint, so tests, benchmarks and the GPU check can build random
weights at the real shapes, a layer at a time:

- attention: q `[heads * head_dim, hidden]`, k/v `[kv_heads * head_dim, hidden]`, o
  `[hidden, heads * head_dim]` (+ q/k/v biases `[rows]` for Qwen2; q/k norms `[head_dim]` for
  Qwen3); `head_dim` = `hidden / heads` when the config has none;
- dense MLP: gate/up `[intermediate, hidden]`, down `[hidden, intermediate]`;
- MoE layers (`num_experts` > 0, every `decoder_sparse_step`-th layer not in `mlp_only_layers`):
  router `mlp.gate.weight [num_experts, hidden]` and per-expert gate/up/down with
  `moe_intermediate_size`, or, with `grouped_experts=True`, the two grouped slabs
  `mlp.experts.gate_up_proj [E, 2 * moe_inter, hidden]` and `mlp.experts.down_proj [E, hidden,
  moe_inter]`;
- norms `[hidden]`, embedding `[vocab, hidden]`, `lm_head` unless `tie_word_embeddings`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

Shape = tuple[int, ...]

# The `config.json` files shipped for the GPU recipes' models, and the four the recipes train,
# by the short key scripts, benchmarks and tests use.
MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "engines" / "nemo" / "model_configs"
RECIPE_MODELS = {
    "llama-3.1-8b": "meta-llama--Llama-3.1-8B-Instruct.json",
    "qwen3-8b": "Qwen--Qwen3-8B-Base.json",
    "qwen3-4b": "Qwen--Qwen3-4B.json",
    "qwen3-30b-a3b": "Qwen--Qwen3-30B-A3B.json",
}


def recipe_model_config(key: str, **overrides: Any) -> dict[str, Any]:
    """The shipped `config.json` of a recipe model (`RECIPE_MODELS` key), with `overrides` set."""
    return {**json.loads((MODEL_CONFIGS / RECIPE_MODELS[key]).read_text()), **overrides}


def _attention(config: Mapping[str, Any]) -> dict[str, Shape]:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    out = {
        "self_attn.q_proj.weight": (heads * head_dim, hidden),
        "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
    }
    archs = config.get("architectures") or []
    if any(a.startswith("Qwen2") for a in archs):
        out |= {
            "self_attn.q_proj.bias": (heads * head_dim,),
            "self_attn.k_proj.bias": (kv,),
            "self_attn.v_proj.bias": (kv,),
        }
    if any(a.startswith("Qwen3") for a in archs):
        out |= {"self_attn.q_norm.weight": (head_dim,), "self_attn.k_norm.weight": (head_dim,)}
    return out


def _is_moe_layer(config: Mapping[str, Any], layer: int) -> bool:
    experts = config.get("num_experts") or 0
    step = config.get("decoder_sparse_step") or 1
    return (
        experts > 0
        and layer not in (config.get("mlp_only_layers") or [])
        and (layer + 1) % step == 0
    )


def _mlp(config: Mapping[str, Any], layer: int, grouped: bool) -> dict[str, Shape]:
    hidden = config["hidden_size"]
    if not _is_moe_layer(config, layer):
        inter = config["intermediate_size"]
        return {
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
        }
    experts, inter = config["num_experts"], config["moe_intermediate_size"]
    out: dict[str, Shape] = {"mlp.gate.weight": (experts, hidden)}
    if grouped:
        out["mlp.experts.gate_up_proj"] = (experts, 2 * inter, hidden)
        out["mlp.experts.down_proj"] = (experts, hidden, inter)
        return out
    for e in range(experts):
        out[f"mlp.experts.{e}.gate_proj.weight"] = (inter, hidden)
        out[f"mlp.experts.{e}.up_proj.weight"] = (inter, hidden)
        out[f"mlp.experts.{e}.down_proj.weight"] = (hidden, inter)
    return out


def layer_shapes(
    config: Mapping[str, Any], layer: int, *, grouped_experts: bool = False
) -> dict[str, Shape]:
    """HF name -> shape of every tensor of decoder layer `layer`."""
    hidden = config["hidden_size"]
    local = {
        "input_layernorm.weight": (hidden,),
        **_attention(config),
        "post_attention_layernorm.weight": (hidden,),
        **_mlp(config, layer, grouped_experts),
    }
    return {f"model.layers.{layer}.{name}": shape for name, shape in local.items()}


def hf_weight_shapes(
    config: Mapping[str, Any],
    *,
    layers: Iterable[int] | None = None,
    grouped_experts: bool = False,
    top_level: bool = True,
) -> Iterator[tuple[str, Shape]]:
    """`(HF name, shape)` of the model's tensors, layer by layer (all layers by default), then
    the embedding, final norm and (untied) `lm_head` when `top_level`."""
    picked = range(config["num_hidden_layers"]) if layers is None else layers
    for layer in picked:
        yield from layer_shapes(config, layer, grouped_experts=grouped_experts).items()
    if top_level:
        vocab, hidden = config["vocab_size"], config["hidden_size"]
        yield "model.embed_tokens.weight", (vocab, hidden)
        yield "model.norm.weight", (hidden,)
        if not config.get("tie_word_embeddings", False):
            yield "lm_head.weight", (vocab, hidden)
