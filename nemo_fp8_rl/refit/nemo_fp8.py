"""Trainer-side FP8 refit payload for NeMo RL: which weights vLLM holds in FP8, and the pairs.

With `refit.quantize_on: trainer`, each weight NeMo RL's vLLM worker would requantize on arrival
travels instead as `name` (E4M3) plus `name + "_scale_inv"` (FP32 block scales), bit-identical to
what NeMo RL's `load_weights` hands to `model.load_weights` (see `nemo_quant.py`); every other
tensor, FP8 KV-scale entries included, passes unchanged.

    layout = NemoFp8Layout(streamed_names, NemoFp8Rules.from_vllm_cfg(vllm_cfg, num_layers))
    for name, tensor in iterator:
        yield from layout.quantize_named(name, tensor)      # [(name, tensor), ...]
    layout.planned(name, shape, dtype)                     # the same entries, as metadata

Which weights are FP8 (NeMo RL's `_is_fp8_weight` on the model vLLM builds with NeMo RL's
`init_fp8` quantization config, v0.7.0 and 7ea279a alike):

- the name ends in `weight` and its module is a vLLM linear layer or fused-MoE experts built
  in FP8: in a decoder layer `model.layers.<i>.`, the attention `q/k/v/o_proj`, the MLP
  `gate/up/down_proj` (dense and shared-expert), per-expert `mlp.experts.<e>.<proj>`, and the
  MoE router `mlp.gate` (vLLM's Qwen3-MoE builds it with the model's quant config; NeMo RL does
  not exclude it; `router_fp8=False` for a vLLM that builds it unquantized). DeepSeek-V3
  architecture (MLA): `q_a_proj`, `q_b_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`, `o_proj` and
  `mlp.shared_experts.<proj>` are linear layers (so NeMo RL's `quantization_ignored_layer_kws:
  [a_proj, b_proj]` keeps the four low-rank projections BF16); its router is built unquantized
  by vLLM's DeepSeek MoE and stays BF16; `e_score_correction_bias` is not a weight. Embeddings,
  `lm_head`, norms (q/k norms included) and biases are never FP8;
- not ignored: the first `num_first_layers_in_bf16` and last `num_last_layers_in_bf16` decoder
  layers are BF16 whole; a module whose name (without `.weight`) contains one of
  `quantization_ignored_layer_kws` is BF16; fused-MoE experts of a layer are BF16 when any of
  that layer's expert names matches (vLLM skips a fused-MoE layer when any ignored entry names
  it), and vLLM refuses a fused linear (`qkv_proj`, `gate_up_proj`) whose shards disagree;
- grouped expert slabs `mlp.experts.gate_up_proj` / `mlp.experts.down_proj` (no `.weight`):
  7ea279a expands them into per-expert FP8 pairs when the layer's experts are FP8
  (`_expand_grouped_moe_expert_to_fp8`: gate = rows [:I], up = rows [I:] of gate_up; names
  `<base>.<e>.<gate_proj|up_proj|down_proj>.weight`; shard-major order, weight then scale);
  v0.7.0 passes them on as BF16 (`expand_grouped_experts=False`). With `is_mx` 7ea279a raises
  on FP8 grouped slabs ("MXFP8 refit does not support grouped MoE expert weights"), and so does
  the layout, when the refit is planned.

MXFP8 (`is_mx`, 7ea279a): the same weights (vLLM's ModelOpt MXFP8 layers hold float8_e4m3fn
weights, which `_is_fp8_weight` tests), each with K a multiple of 32; `pow2_*` do not apply.

`use_deep_gemm` only sets vLLM's environment (`VLLM_USE_DEEP_GEMM=1`, `VLLM_USE_DEEP_GEMM_E8M0=0`)
for what vLLM does after loading; the tensors handed to `model.load_weights` are the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import USAGE, UserError
from nemo_fp8_rl.refit.nemo_mxfp8 import MX_BLOCK, quantize_mxfp8_like_nemo_rl
from nemo_fp8_rl.refit.nemo_quant import quantize_blockwise_like_nemo_rl
from nemo_fp8_rl.refit.nemo_scale import BLOCK

SCALE_SUFFIX = "_scale_inv"
MX_SCALE_SUFFIX = "_scale_from_checkpoint"
VLLM_CFG = "policy.generation.vllm_cfg"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.\d+\.(?:gate|up|down)_proj$")
_GROUPED = re.compile(r"^mlp\.experts\.(?:gate_up_proj|down_proj)$")
_LINEAR = re.compile(
    r"^(?:self_attn\.(?:[qkvo]_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)|"
    r"mlp\.(?:shared_experts?\.)?(?:gate|up|down)_proj)$"
)
_NOT_LINEAR = re.compile(
    r"^(?:input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|"
    r"post_feedforward_layernorm|self_attn\.[qk]_norm|self_attn\.(?:q|kv)_a_layernorm|"
    r"mlp\.shared_expert_gate)$"
)
_MLA = "self_attn.kv_a_proj_with_mqa"
_TOP_LEVEL = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
_FUSED = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "gate_up",
    "up_proj": "gate_up",
    "q_a_proj": "fused_qkv_a",  # vLLM's MLA fuses q_a_proj and kv_a_proj_with_mqa
    "kv_a_proj_with_mqa": "fused_qkv_a",
}


@dataclass(frozen=True)
class NemoFp8Rules:
    """NeMo RL's `vllm_cfg` keys that decide the FP8 layout (see the module docstring)."""

    num_layers: int
    pow2: bool = False
    first_bf16: int = 0
    last_bf16: int = 0
    ignored_keywords: tuple[str, ...] = ()
    router_fp8: bool = True
    expand_grouped_experts: bool = True
    mx: bool = False  # vllm_cfg.is_mx: MXFP8 pairs (1x32 E8M0 bytes) instead of block FP8

    @property
    def scale_suffix(self) -> str:
        """The name suffix of each FP8 weight's scale tensor."""
        return MX_SCALE_SUFFIX if self.mx else SCALE_SUFFIX

    @classmethod
    def from_vllm_cfg(
        cls,
        vllm_cfg: Mapping[str, Any],
        num_layers: int,
        *,
        expand_grouped_experts: bool = True,
        bf16_layer_ranges_apply: bool = True,
        reads_is_mx: bool = True,
    ) -> NemoFp8Rules:
        """Rules from `policy.generation.vllm_cfg`; refuses a BF16 rollout, and MXFP8 where the
        NeMo RL in use does not read `is_mx` (`reads_is_mx=False`: v0.7.0).

        For NeMo RL v0.7.0 pass `expand_grouped_experts=False` and
        `bf16_layer_ranges_apply=False`: its `init_fp8` appends each BF16 layer range to
        `ignored_layers` as a nested list (`bf16_params.append(...)`, `extend` from 7ea279a on),
        which vLLM's exact-name match never finds, so what vLLM then holds is not what the keys
        say; a non-zero `num_first/last_layers_in_bf16` is refused there.
        """
        for key in ("num_first_layers_in_bf16", "num_last_layers_in_bf16"):
            if vllm_cfg.get(key) and not bf16_layer_ranges_apply:
                raise UserError(
                    f"{VLLM_CFG}.{key}",
                    "this NeMo RL (v0.7.0) passes BF16 layer ranges to vLLM as a nested list "
                    "that vLLM never matches, so which layers it holds in FP8 is not decided "
                    "by this key",
                    f"set {VLLM_CFG}.{key}: 0, or refit.quantize_on: generator",
                    USAGE,
                )
        if vllm_cfg.get("precision") != "fp8":
            raise UserError(
                f"{VLLM_CFG}.precision",
                f"is {vllm_cfg.get('precision')!r}: vLLM holds no FP8 weight to send",
                f"set {VLLM_CFG}.precision: fp8, or refit.quantize_on: generator",
                USAGE,
            )
        if vllm_cfg.get("is_mx") and not reads_is_mx:
            raise UserError(
                f"{VLLM_CFG}.is_mx",
                "this NeMo RL (v0.7.0) does not read is_mx: its vLLM worker would serve block "
                "FP8, not the MXFP8 pairs made here",
                f"use NeMo RL 7ea279a or later, or set {VLLM_CFG}.is_mx: false",
                USAGE,
            )
        return cls(
            num_layers=int(num_layers),
            pow2=bool(vllm_cfg.get("pow2_weight_scaling_factors") or False),
            first_bf16=int(vllm_cfg.get("num_first_layers_in_bf16") or 0),
            last_bf16=int(vllm_cfg.get("num_last_layers_in_bf16") or 0),
            ignored_keywords=tuple(vllm_cfg.get("quantization_ignored_layer_kws") or ()),
            expand_grouped_experts=expand_grouped_experts,
            mx=bool(vllm_cfg.get("is_mx")),
        )

    def layer_in_bf16(self, layer: int) -> bool:
        """True for the first `first_bf16` and the last `last_bf16` decoder layers."""
        return layer < self.first_bf16 or layer >= self.num_layers - self.last_bf16

    def keyword_ignored(self, module: str) -> bool:
        """True when a `quantization_ignored_layer_kws` entry is a substring of `module`."""
        return any(kw in module for kw in self.ignored_keywords)


def _unknown(name: str) -> UserError:
    return UserError(
        "refit.quantize_on",
        f"cannot tell whether vLLM holds {name!r} in FP8 (not a Llama/Qwen decoder weight name)",
        "set refit.quantize_on: generator for this model (NeMo RL then quantizes on arrival)",
        USAGE,
    )


def _split(name: str) -> tuple[int, str] | None:
    """`(layer, module)` for `model.layers.<layer>.<module>[.weight]`, else None."""
    match = _LAYER.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2).removesuffix(".weight")


class NemoFp8Layout:
    """The FP8/BF16 decision for every name one refit streams, under `rules`."""

    def __init__(self, names: Iterable[str], rules: NemoFp8Rules) -> None:
        self.rules = rules
        self.names = tuple(names)
        expert_modules: dict[int, list[str]] = {}
        for name in self.names:
            split = _split(name)
            if split and (_EXPERT.match(split[1]) or _GROUPED.match(split[1])):
                expert_modules.setdefault(split[0], []).append(name.removesuffix(".weight"))
        self.bf16_expert_layers = frozenset(
            layer
            for layer, modules in expert_modules.items()
            if rules.layer_in_bf16(layer) or any(map(rules.keyword_ignored, modules))
        )
        # vLLM's DeepSeek-V2/V3 MoE builds its router (`mlp.gate`) without the quant config, so
        # with MLA (DeepSeek-V3, Moonlight) the router stays BF16 whatever `router_fp8` says.
        self.router_fp8 = rules.router_fp8 and not any(_MLA in n for n in self.names)
        self.fp8_names = frozenset(n for n in self.names if self._decide(n))
        self._check_fused_shards()

    def _decide(self, name: str) -> bool:
        if not name.endswith("weight"):
            return False
        split = _split(name)
        if split is None:
            if name in _TOP_LEVEL:
                return False
            raise _unknown(name)
        layer, module = split
        if _EXPERT.match(module):
            return layer not in self.bf16_expert_layers
        if _NOT_LINEAR.match(module) or (module == "mlp.gate" and not self.router_fp8):
            return False
        if not (_LINEAR.match(module) or module == "mlp.gate"):
            raise _unknown(name)
        full = name.removesuffix(".weight")
        return not (self.rules.layer_in_bf16(layer) or self.rules.keyword_ignored(full))

    def _check_fused_shards(self) -> None:
        groups: dict[str, set[bool]] = {}
        for name in self.names:
            split = _split(name)
            if split is None or not name.endswith(".weight") or _EXPERT.match(split[1]):
                continue
            parent, _, proj = split[1].rpartition(".")
            if proj in _FUSED:
                key = f"model.layers.{split[0]}.{parent}.{_FUSED[proj]}_proj"
                groups.setdefault(key, set()).add(name in self.fp8_names)
        for key, states in sorted(groups.items()):
            if len(states) > 1:
                raise UserError(
                    f"{VLLM_CFG}.quantization_ignored_layer_kws",
                    f"keeps some but not all shards of {key} in BF16; vLLM requires every "
                    "shard of a fused layer to share one precision",
                    "choose keywords that match all of q/k/v_proj (or gate/up_proj) or none",
                    USAGE,
                )

    def is_fp8(self, name: str) -> bool:
        """True when `name` travels as an (E4M3, `_scale_inv`) pair."""
        return name in self.fp8_names

    def expands(self, name: str) -> bool:
        """True for a grouped expert slab that travels as per-expert FP8 pairs (with MXFP8 such
        a slab is refused, as NeMo RL's `load_weights` refuses it)."""
        split = _split(name)
        fp8_slab = bool(
            split and _GROUPED.match(split[1]) and split[0] not in self.bf16_expert_layers
        )
        if fp8_slab and self.rules.mx:
            raise UserError(
                f"{VLLM_CFG}.is_mx",
                f"{name}: NeMo RL's MXFP8 refit does not support grouped MoE expert weights "
                "(7ea279a fp8.py load_weights raises NotImplementedError)",
                f"set {VLLM_CFG}.is_mx: false, or keep these experts in BF16 "
                "(quantization_ignored_layer_kws)",
                USAGE,
            )
        return fp8_slab and self.rules.expand_grouped_experts

    def quantize_named(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """What NeMo RL's `load_weights` would hand vLLM for this streamed tensor."""
        if self.expands(name):
            return expand_grouped_experts(name, tensor, pow2=self.rules.pow2)
        if not self.is_fp8(name):
            return [(name, tensor)]
        if self.rules.mx:
            _mx_shape(name, tuple(tensor.shape))
            q, scales = quantize_mxfp8_like_nemo_rl(tensor, what=name)
            return [(name, q), (name + MX_SCALE_SUFFIX, scales)]
        q, scale_inv = quantize_blockwise_like_nemo_rl(tensor, pow2_scale=self.rules.pow2)
        return [(name, q), (name + SCALE_SUFFIX, scale_inv)]

    def planned(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype
    ) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """`quantize_named`'s entries as `(name, shape, dtype)`, without any tensor."""
        shape = tuple(shape)
        if self.expands(name):
            return [(n, s, d) for n, s, d in expanded_shapes(name, shape)]
        if not self.is_fp8(name):
            return [(name, shape, dtype)]
        if self.rules.mx:
            return [
                (name, shape, torch.float8_e4m3fn),
                (name + MX_SCALE_SUFFIX, _mx_shape(name, shape), torch.uint8),
            ]
        return [
            (name, shape, torch.float8_e4m3fn),
            (name + SCALE_SUFFIX, _scale_shape(shape), torch.float32),
        ]


def _scale_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"an FP8 weight must be 2-D, got shape {list(shape)}")
    return math.ceil(shape[0] / BLOCK), math.ceil(shape[1] / BLOCK)


def _mx_shape(name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """E8M0 byte grid `(m, n/32)` of a 2-D MXFP8 weight; refuses what vLLM's MXFP8 layer cannot
    hold (not 2-D, or K not a multiple of 32)."""
    if len(shape) != 2 or shape[1] % MX_BLOCK:
        raise UserError(
            f"{VLLM_CFG}.is_mx",
            f"{name} of shape {list(shape)}: an MXFP8 weight is 2-D with K a multiple of "
            f"{MX_BLOCK} (vLLM's ModelOpt MXFP8 linear)",
            f"keep it in BF16 (quantization_ignored_layer_kws), or set {VLLM_CFG}.is_mx: false",
            USAGE,
        )
    return shape[0], shape[1] // MX_BLOCK


def _shards(key: str, shape: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """`(projection, first row, end row)` of each unfused projection in a grouped slab."""
    if len(shape) != 3:
        raise ValueError(
            f"grouped experts {key!r} must be 3-D [experts, out, in], got {list(shape)}"
        )
    if key.endswith(".gate_up_proj"):
        half = shape[1] // 2
        shards = [("gate_proj", 0, half), ("up_proj", half, shape[1])]
    else:
        shards = [("down_proj", 0, shape[1])]
    for proj, start, end in shards:
        if (end - start) % BLOCK or shape[2] % BLOCK:
            raise UserError(
                "refit.quantize_on",
                f"grouped experts {key!r} of shape {list(shape)}: {proj} is not a whole number "
                f"of {BLOCK}x{BLOCK} blocks per expert (NeMo RL's expansion asserts this)",
                "set refit.quantize_on: generator for this model",
                USAGE,
            )
    return shards


def expanded_shapes(
    key: str, shape: tuple[int, ...]
) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Per-expert `(name, shape, dtype)` entries a grouped slab `key` expands into."""
    base = key.rsplit(".", 1)[0]
    out = []
    for proj, start, end in _shards(key, shape):
        rows = end - start
        for e in range(shape[0]):
            name = f"{base}.{e}.{proj}.weight"
            out.append((name, (rows, shape[2]), torch.float8_e4m3fn))
            out.append((name + SCALE_SUFFIX, _scale_shape((rows, shape[2])), torch.float32))
    return out


def expand_grouped_experts(
    key: str, weight: torch.Tensor, *, pow2: bool
) -> list[tuple[str, torch.Tensor]]:
    """Per-expert (E4M3, `_scale_inv`) pairs of a grouped slab, as 7ea279a's
    `_expand_grouped_moe_expert_to_fp8` emits them (names and order: `expanded_shapes`)."""
    base = key.rsplit(".", 1)[0]
    out: list[tuple[str, torch.Tensor]] = []
    for proj, start, end in _shards(key, tuple(weight.shape)):
        for e in range(weight.shape[0]):
            q, scale_inv = quantize_blockwise_like_nemo_rl(weight[e, start:end], pow2_scale=pow2)
            name = f"{base}.{e}.{proj}.weight"
            out += [(name, q), (name + SCALE_SUFFIX, scale_inv)]
    return out


def fp8_weight_names(names: Iterable[str], rules: NemoFp8Rules) -> frozenset[str]:
    """The streamed names vLLM holds in FP8 under `rules` (grouped slabs excluded)."""
    return NemoFp8Layout(names, rules).fp8_names


def is_fp8_weight(name: str, rules: NemoFp8Rules, names: Iterable[str] | None = None) -> bool:
    """True when vLLM holds `name` in FP8; `names` (default: just `name`) are all the names
    streamed, needed only when keywords may reach other experts of the same layer."""
    return NemoFp8Layout(names if names is not None else [name], rules).is_fp8(name)


def quantize_named(
    name: str, tensor: torch.Tensor, layout: NemoFp8Layout
) -> list[tuple[str, torch.Tensor]]:
    """`layout.quantize_named(name, tensor)` as a function."""
    return layout.quantize_named(name, tensor)


__all__ = [
    "MX_SCALE_SUFFIX",
    "SCALE_SUFFIX",
    "NemoFp8Layout",
    "NemoFp8Rules",
    "expand_grouped_experts",
    "expanded_shapes",
    "fp8_weight_names",
    "is_fp8_weight",
    "quantize_blockwise_like_nemo_rl",
    "quantize_named",
]
