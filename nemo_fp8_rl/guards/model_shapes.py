"""The linear layers (GEMMs) of a model, read from its HF `config.json`, as Megatron shards them.

Each `Gemm` is one weight matrix `[out, in]` of one decoder layer kind, with how Megatron-Core
splits it under tensor parallelism (`column`: `out / TP`, `row`: `in / TP`, `duplicated`: whole
on every rank) and whether it is a routed expert (split by EP across ranks and by the expert
tensor-parallel size ETP inside one). Shapes follow Megatron-Core's layer specs:

| GEMM | out | in | split |
|---|---|---|---|
| `linear_qkv` (GQA) | `(heads + 2 kv_heads) * head_dim` | `hidden` | column |
| `linear_q_proj` / `linear_q_up_proj` (MLA) | `heads * (qk_nope + qk_rope)` | `hidden` / `q_lora_rank` | column |
| `linear_q_down_proj` (MLA with a query LoRA) | `q_lora_rank` | `hidden` | duplicated |
| `linear_kv_down_proj` (MLA) | `kv_lora_rank + qk_rope` | `hidden` | duplicated |
| `linear_kv_up_proj` (MLA) | `heads * (qk_nope + v_head)` | `kv_lora_rank` | column |
| `linear_proj` | `hidden` | `heads * v_head` (MLA) or `heads * head_dim` | row |
| `linear_fc1` (gated: gate and up fused) | `2 * ffn` | `hidden` | column |
| `linear_fc2` | `hidden` | `ffn` | row |

`ffn` is `intermediate_size` for dense layers, `moe_intermediate_size` for routed experts and
`n_shared_experts * moe_intermediate_size` (or `shared_expert_intermediate_size`) for shared
experts. The router, embeddings and output layer are not Transformer Engine FP8 GEMMs in
Megatron-Core (they are listed by `embedding_params` for the memory estimate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gemm:
    """One weight matrix kind: `[out, in]`, its TP split, and how many the model holds."""

    name: str
    out: int
    inp: int
    split: str  # "column" | "row" | "duplicated"
    layers: int  # decoder layers that hold it
    per_layer: int = 1  # copies per layer (routed experts: the number of experts)
    expert: bool = False  # routed expert: split over EP ranks and by ETP inside one
    active_per_layer: int | None = None  # experts a token uses (top-k); None: all

    @property
    def params(self) -> int:
        return self.out * self.inp * self.per_layer * self.layers

    @property
    def active_params(self) -> int:
        used = self.per_layer if self.active_per_layer is None else self.active_per_layer
        return self.out * self.inp * used * self.layers

    def shard(self, tp: int, etp: int = 1) -> tuple[int, int]:
        """`(out, in)` held by one rank under TP (ETP for experts)."""
        t = etp if self.expert else tp
        if self.split == "column":
            return self.out // t, self.inp
        if self.split == "row":
            return self.out, self.inp // t
        return self.out, self.inp


def num_experts(hf: dict[str, Any]) -> int:
    return int(hf.get("num_experts") or hf.get("n_routed_experts") or 0)


def moe_layer_count(hf: dict[str, Any]) -> int:
    """Decoder layers whose MLP is routed experts (the rest are dense)."""
    layers = int(hf["num_hidden_layers"])
    if not num_experts(hf):
        return 0
    dense = set(hf.get("mlp_only_layers") or [])
    first_dense = int(hf.get("first_k_dense_replace") or 0)
    step = int(hf.get("decoder_sparse_step") or hf.get("moe_layer_freq") or 1)
    return sum(
        1 for i in range(layers) if i not in dense and i >= first_dense and (i + 1) % step == 0
    )


def _attention(hf: dict[str, Any], layers: int) -> list[Gemm]:
    hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    if hf.get("kv_lora_rank"):  # MLA (DeepSeek-V3, Moonlight)
        nope, rope, v = (int(hf[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        kv_rank, q_rank = int(hf["kv_lora_rank"]), hf.get("q_lora_rank")
        out = []
        if q_rank:
            out.append(Gemm("linear_q_down_proj", int(q_rank), hidden, "duplicated", layers))
            out.append(
                Gemm("linear_q_up_proj", heads * (nope + rope), int(q_rank), "column", layers)
            )
        else:
            out.append(Gemm("linear_q_proj", heads * (nope + rope), hidden, "column", layers))
        out.append(Gemm("linear_kv_down_proj", kv_rank + rope, hidden, "duplicated", layers))
        out.append(Gemm("linear_kv_up_proj", heads * (nope + v), kv_rank, "column", layers))
        out.append(Gemm("linear_proj", hidden, heads * v, "row", layers))
        return out
    kv = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or hidden // heads)
    return [
        Gemm("linear_qkv", (heads + 2 * kv) * head_dim, hidden, "column", layers),
        Gemm("linear_proj", hidden, heads * head_dim, "row", layers),
    ]


def _mlp(name: str, ffn: int, hidden: int, layers: int, **kw: Any) -> list[Gemm]:
    if not layers or not ffn:
        return []
    return [
        Gemm(f"{name}.linear_fc1", 2 * ffn, hidden, "column", layers, **kw),
        Gemm(f"{name}.linear_fc2", hidden, ffn, "row", layers, **kw),
    ]


def decoder_gemms(hf: dict[str, Any]) -> list[Gemm]:
    """Every linear weight kind of the decoder layers (module docstring), MTP layers excluded."""
    layers, hidden = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    moe = moe_layer_count(hf)
    out = _attention(hf, layers)
    out += _mlp("mlp", int(hf.get("intermediate_size") or 0), hidden, layers - moe)
    experts = num_experts(hf)
    if moe:
        inter = int(hf.get("moe_intermediate_size") or hf["intermediate_size"])
        top_k = int(hf.get("num_experts_per_tok") or 1)
        out += _mlp(
            "experts",
            inter,
            hidden,
            moe,
            per_layer=experts,
            expert=True,
            active_per_layer=top_k,
        )
        shared = int(hf.get("shared_expert_intermediate_size") or 0) or (
            int(hf.get("n_shared_experts") or 0) * inter
        )
        out += _mlp("shared_experts", shared, hidden, moe)
    return out


def embedding_params(hf: dict[str, Any]) -> tuple[int, int]:
    """(input embedding, output layer) parameters; the output layer is 0 when tied."""
    emb = int(hf["vocab_size"]) * int(hf["hidden_size"])
    return emb, 0 if hf.get("tie_word_embeddings") else emb


def norm_and_router_params(hf: dict[str, Any]) -> int:
    """RMSNorm weights (2 per layer + final; QK-norm and MLA latent norms) and router weights."""
    layers, hidden = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    total = (2 * layers + 1) * hidden
    head_dim = int(hf.get("head_dim") or hidden // int(hf["num_attention_heads"]))
    if str(hf.get("model_type", "")).startswith("qwen3"):
        total += 2 * head_dim * layers
    if hf.get("kv_lora_rank"):
        total += (int(hf["kv_lora_rank"]) + int(hf.get("q_lora_rank") or 0)) * layers
    total += num_experts(hf) * hidden * moe_layer_count(hf)
    return total


@dataclass(frozen=True)
class ParamCount:
    total: int
    non_embedding: int
    active: int  # per token (top-k experts)
    linear: int  # decoder GEMM weights (what FP8 quantizes)


def count_params(hf: dict[str, Any]) -> ParamCount:
    """Parameter counts from `config.json` (biases left out: < 0.01 % for these models)."""
    gemms = decoder_gemms(hf)
    linear = sum(g.params for g in gemms)
    active_linear = sum(g.active_params for g in gemms)
    emb, head = embedding_params(hf)
    other = norm_and_router_params(hf)
    total = linear + emb + head + other
    return ParamCount(total, total - emb - head, active_linear + emb + head + other, linear)


# Counts a decoder config.json gives, each a whole number >= 1 where it is given (a multimodal
# config nests them under text_config, which the estimates do not read).
POSITIVE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
)


def shape_problems(hf: dict[str, Any]) -> list[str]:
    """What makes `hf` (a model's config.json) no model at all: a layer, width, head or
    vocabulary count that is not a whole number >= 1, kv heads that do not divide the heads, a
    width the heads do not divide (without `head_dim`). Empty for a model an estimate can be
    made for."""
    problems = []
    for key in (k for k in POSITIVE_KEYS if hf.get(k) is not None):
        value = hf.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{key} is {value!r}, not a whole number >= 1")
    if problems or "num_attention_heads" not in hf or "hidden_size" not in hf:
        return problems
    heads, kv = (
        hf["num_attention_heads"],
        hf.get("num_key_value_heads") or hf["num_attention_heads"],
    )
    if heads % kv:
        problems.append(f"num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    if hf.get("head_dim") is None and hf["hidden_size"] % heads:
        problems.append(f"hidden_size {hf['hidden_size']} is not a multiple of {heads} heads")
    return problems
