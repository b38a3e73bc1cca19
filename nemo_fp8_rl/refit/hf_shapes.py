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
- norms `[hidden]`, embedding `[vocab, hidden]`, `lm_head` unless `tie_word_embeddings`;
- DeepSeek-V3 architecture (`kv_lora_rank` set: DeepSeek-V3, Moonlight), HF names as vLLM
  loads them: MLA `q_a_proj [q_lora, hidden]`, `q_a_layernorm [q_lora]`, `q_b_proj [heads *
  (nope + rope), q_lora]` (or `q_proj [heads * (nope + rope), hidden]` without a query LoRA),
  `kv_a_proj_with_mqa [kv_lora + rope, hidden]`, `kv_a_layernorm [kv_lora]`, `kv_b_proj [heads *
  (nope + v), kv_lora]`, `o_proj [hidden, heads * v]`; the first `first_k_dense_replace` layers
  dense, then MoE: router `mlp.gate.weight [E, hidden]` and `mlp.gate.e_score_correction_bias
  [E]`, experts `mlp.experts.<e>.<gate|up|down>_proj`, and `mlp.shared_experts.<proj>` with
  `n_shared_experts * moe_intermediate_size`. The MTP layer (`num_nextn_predict_layers`) is not
  listed: NeMo RL trains with `mtp_num_layers: 0` and refits only the decoder layers.
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
    "deepseek-v3": "deepseek-ai--DeepSeek-V3.json",
    "moonlight-16b-a3b": "moonshotai--Moonlight-16B-A3B-Instruct.json",
}


def is_mla(config: Mapping[str, Any]) -> bool:
    """DeepSeek-V3 architecture (multi-head latent attention)."""
    return bool(config.get("kv_lora_rank"))


def _mla_attention(config: Mapping[str, Any]) -> dict[str, Shape]:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q_lora, kv_lora = config.get("q_lora_rank"), config["kv_lora_rank"]
    out: dict[str, Shape] = {}
    if q_lora:
        out["self_attn.q_a_proj.weight"] = (q_lora, hidden)
        out["self_attn.q_a_layernorm.weight"] = (q_lora,)
        out["self_attn.q_b_proj.weight"] = (heads * (nope + rope), q_lora)
    else:
        out["self_attn.q_proj.weight"] = (heads * (nope + rope), hidden)
    out["self_attn.kv_a_proj_with_mqa.weight"] = (kv_lora + rope, hidden)
    out["self_attn.kv_a_layernorm.weight"] = (kv_lora,)
    out["self_attn.kv_b_proj.weight"] = (heads * (nope + v), kv_lora)
    out["self_attn.o_proj.weight"] = (hidden, heads * v)
    return out


def _deepseek_mlp(config: Mapping[str, Any], layer: int) -> dict[str, Shape]:
    hidden = config["hidden_size"]
    if layer < (config.get("first_k_dense_replace") or 0):
        inter = config["intermediate_size"]
        return {
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
        }
    experts, inter = config["n_routed_experts"], config["moe_intermediate_size"]
    shared = (config.get("n_shared_experts") or 0) * inter
    out: dict[str, Shape] = {"mlp.gate.weight": (experts, hidden)}
    if config.get("topk_method") == "noaux_tc":
        out["mlp.gate.e_score_correction_bias"] = (experts,)
    for e in range(experts):
        out[f"mlp.experts.{e}.gate_proj.weight"] = (inter, hidden)
        out[f"mlp.experts.{e}.up_proj.weight"] = (inter, hidden)
        out[f"mlp.experts.{e}.down_proj.weight"] = (hidden, inter)
    if shared:
        out["mlp.shared_experts.gate_proj.weight"] = (shared, hidden)
        out["mlp.shared_experts.up_proj.weight"] = (shared, hidden)
        out["mlp.shared_experts.down_proj.weight"] = (hidden, shared)
    return out


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
    mla = is_mla(config)
    local = {
        "input_layernorm.weight": (hidden,),
        **(_mla_attention(config) if mla else _attention(config)),
        "post_attention_layernorm.weight": (hidden,),
        **(_deepseek_mlp(config, layer) if mla else _mlp(config, layer, grouped_experts)),
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
