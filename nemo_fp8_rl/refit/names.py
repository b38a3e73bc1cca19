"""Name and layout mapping: Megatron-Core GPT and transformers names → the engine's HF names.

The engine (vLLM, or a transformers model) loads HF *checkpoint* names: per-module
`q_proj`/`k_proj`/`v_proj`, `gate_proj`/`up_proj`, and per-expert `mlp.experts.{e}.*_proj` for
MoE. vLLM stacks q/k/v and gate/up itself (`WeightsMapper(orig_to_new_stacked)`), so the bridge
always emits the unstacked HF names.

Megatron-Core layouts that need splitting:

- `self_attention.linear_qkv.weight` `[G·(H/G + 2)·d, hidden]` interleaves per query group g:
  rows `[q heads of g (H/G·d) | k of g (d) | v of g (d)]`. Viewed as `(G, H/G + 2, d, hidden)`:
  q = `[:, :H/G]`, k = `[:, H/G]`, v = `[:, H/G + 1]` (grouped-query attention, G groups).
- `mlp.linear_fc1.weight` `[2·ffn, hidden]` with a gated unit is `[gate; up]` (chunk 2, dim 0).
- Transformer Engine specs fuse the norms into the next linear: `linear_qkv.layer_norm_weight`
  is the attention input norm, `linear_fc1.layer_norm_weight` the pre-MLP norm.
- MoE experts: `mlp.experts.local_experts.{e}.linear_fc{1,2}.weight` (SequentialMLP) or
  `mlp.experts.linear_fc{1,2}.weight{e}` (TEGroupedMLP); the router `mlp.router.weight` is HF's
  `mlp.gate.weight`.

transformers ≥ 5 stores MoE experts fused per layer (`mlp.experts.gate_up_proj` `[E, 2I, hidden]`
gate first, `mlp.experts.down_proj` `[E, hidden, I]`); `hf_to_engine` splits them per expert.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UsageError

NamedTensor = tuple[str, torch.Tensor]

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT_SEQ = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight$")
_EXPERT_GROUPED = re.compile(r"^mlp\.experts\.linear_fc([12])\.weight(\d+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_HF_FUSED_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")

_GLOBAL = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_IN_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
}


class MappingError(UsageError, ValueError):
    """A parameter name or shape that the mapping does not know how to convert."""


FIX_LAYOUT = (
    "give the model's head counts from its config.json (both positive, heads a multiple of groups)"
)
FIX_MODEL = (
    "use a Llama/Qwen3 dense or Qwen3-MoE model (local or Transformer Engine spec), the ones the "
    "mapping supports"
)


@dataclass(frozen=True)
class AttentionLayout:
    """Head counts needed to split Megatron's fused QKV (GQA: `num_query_groups` ≤ heads)."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.num_attention_heads, self.num_query_groups, self.head_dim) < 1:
            raise MappingError(
                "attention layout", f"head counts must be positive, got {self}", FIX_LAYOUT
            )
        if self.num_attention_heads % self.num_query_groups:
            raise MappingError(
                f"num_attention_heads={self.num_attention_heads}",
                f"not a multiple of num_query_groups={self.num_query_groups}",
                FIX_LAYOUT,
            )

    @classmethod
    def from_hf_config(cls, config: Any) -> AttentionLayout:
        """From a transformers config (`num_key_value_heads`, `head_dim` or hidden/heads)."""
        heads = config.num_attention_heads
        groups = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(heads, groups, head_dim)

    @classmethod
    def from_megatron_config(cls, config: Any) -> AttentionLayout:
        """From a megatron-core `TransformerConfig` (`num_query_groups`, `kv_channels`)."""
        heads = config.num_attention_heads
        groups = config.num_query_groups or heads
        head_dim = config.kv_channels or config.hidden_size // heads
        return cls(heads, groups, head_dim)


def split_qkv(fused: torch.Tensor, layout: AttentionLayout, name: str) -> tuple[torch.Tensor, ...]:
    """Split Megatron's interleaved `linear_qkv` weight (or bias) into HF q, k, v.

    Rows are `G` groups of `(H/G + 2)·d`: view as `(G, H/G + 2, d, *rest)`, then
    q = `[:, :H/G]` → `(H·d, *rest)`, k = `[:, H/G]` → `(G·d, *rest)`, v = `[:, H/G+1]`.
    """
    g, d = layout.num_query_groups, layout.head_dim
    per_group = layout.num_attention_heads // g
    rows = g * (per_group + 2) * d
    if fused.shape[0] != rows:
        raise MappingError(
            name,
            f"fused QKV has {fused.shape[0]} rows but {layout} needs G·(H/G + 2)·d = {rows}",
            "pass the model's real head counts",
        )
    rest = tuple(fused.shape[1:])
    grouped = fused.reshape(g, per_group + 2, d, *rest)
    q = grouped[:, :per_group].reshape(g * per_group * d, *rest)
    k = grouped[:, per_group].reshape(g * d, *rest)
    v = grouped[:, per_group + 1].reshape(g * d, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def split_gate_up(fused: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a gated `linear_fc1` (`[gate; up]`, dim 0) into HF gate_proj and up_proj."""
    if fused.shape[0] % 2:
        raise MappingError(
            name, f"gated linear_fc1 needs an even row count, got {fused.shape[0]}", FIX_MODEL
        )
    gate, up = fused.chunk(2, dim=0)
    return gate.contiguous(), up.contiguous()


def _megatron_layer(
    layer: int, rest: str, tensor: torch.Tensor, layout: AttentionLayout, name: str
) -> list[NamedTensor]:
    prefix = f"model.layers.{layer}."
    if rest in _IN_LAYER:
        return [(prefix + _IN_LAYER[rest], tensor)]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = split_qkv(tensor, layout, name)
        return [
            (f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)
        ]
    if rest == "mlp.linear_fc1.weight":
        gate, up = split_gate_up(tensor, name)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    seq, grouped = _EXPERT_SEQ.match(rest), _EXPERT_GROUPED.match(rest)
    if seq or grouped:
        expert, fc = (seq.group(1), seq.group(2)) if seq else (grouped.group(2), grouped.group(1))
        base = f"{prefix}mlp.experts.{int(expert)}."
        if fc == "2":
            return [(base + "down_proj.weight", tensor)]
        gate, up = split_gate_up(tensor, name)
        return [(base + "gate_proj.weight", gate), (base + "up_proj.weight", up)]
    raise MappingError(
        name, f"no HF equivalent known for Megatron parameter '{rest}' of layer {layer}", FIX_MODEL
    )


def megatron_to_hf(name: str, tensor: torch.Tensor, layout: AttentionLayout) -> list[NamedTensor]:
    """Map one Megatron-Core GPT parameter to its HF checkpoint name(s) and tensor(s).

    Returns `[]` for Transformer Engine `_extra_state` entries (FP8 metadata, not weights).
    Fused tensors are split (see the module docstring); everything else is renamed only.
    """
    name = name.removeprefix("module.")
    if name.endswith("._extra_state"):
        return []
    if name in _GLOBAL:
        return [(_GLOBAL[name], tensor)]
    match = _LAYER.match(name)
    if match is None:
        raise MappingError(
            name,
            "not a Megatron-Core GPT parameter name (expected 'embedding.*', "
            "'decoder.layers.<i>.*', 'decoder.final_layernorm.weight' or 'output_layer.weight')",
            FIX_MODEL,
        )
    return _megatron_layer(int(match.group(1)), match.group(2), tensor, layout, name)


def megatron_to_engine(
    named_tensors: Iterable[NamedTensor], layout: AttentionLayout
) -> Iterator[NamedTensor]:
    """Stream a Megatron-Core GPT state dict as HF-named tensors, one parameter at a time."""
    for name, tensor in named_tensors:
        if tensor is None or not isinstance(tensor, torch.Tensor):
            continue
        yield from megatron_to_hf(name, tensor, layout)


def hf_to_engine(named_tensors: Iterable[NamedTensor]) -> Iterator[NamedTensor]:
    """Stream transformers parameters under HF checkpoint names.

    Dense Llama/Qwen3 names pass through; fused MoE experts of transformers ≥ 5
    (`mlp.experts.gate_up_proj` `[E, 2I, hidden]`, `mlp.experts.down_proj` `[E, hidden, I]`)
    become `mlp.experts.{e}.{gate,up,down}_proj.weight`.
    """
    for name, tensor in named_tensors:
        match = _HF_FUSED_EXPERTS.match(name)
        if match is None:
            yield name, tensor
            continue
        base, kind = match.groups()
        if tensor.dim() != 3:
            raise MappingError(
                name,
                f"fused experts must be 3-D [experts, out, in], got {list(tensor.shape)}",
                FIX_MODEL,
            )
        for e in range(tensor.shape[0]):
            if kind == "down_proj":
                yield f"{base}.{e}.down_proj.weight", tensor[e]
            else:
                gate, up = split_gate_up(tensor[e], name)
                yield f"{base}.{e}.gate_proj.weight", gate
                yield f"{base}.{e}.up_proj.weight", up


def layer_index(hf_name: str) -> int | None:
    """Decoder layer index of an HF name (`model.layers.<i>.…`), or None outside the layers."""
    match = _HF_LAYER.match(hf_name)
    return int(match.group(1)) if match else None
