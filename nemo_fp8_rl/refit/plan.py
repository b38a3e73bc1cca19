"""`RefitPlan`: which engine tensors travel as FP8, in which scheme, and which stay BF16.

Built from the resolved recipe with NeMo RL's own keys (`policy.generation.vllm_cfg.*`,
`policy.generation.vllm_kwargs.quantization`) plus the project's `refit` section:

| key | effect |
|---|---|
| `vllm_cfg.precision` | `"fp8"` → FP8 refit; anything else → everything BF16 |
| `vllm_kwargs.quantization` | absent/`fp8`/`fp8_per_block` → block 128×128 (`weight_scale_inv`); `fp8_per_tensor` → per-tensor (`weight_scale`, one scale shared by q/k/v and by gate/up); `fp8_per_channel`/`compressed-tensors` → per-channel (`weight_scale` `[N, 1]`) |
| `vllm_cfg.pow2_weight_scaling_factors`, `use_deep_gemm` | power-of-2 scales: DeepGEMM's UE8M0 requantization then keeps q × scale bit-exact (it may re-express a tile whose largest code is ≤ 224 as doubled codes with a halved scale; the values are unchanged) |
| `vllm_cfg.num_first_layers_in_bf16` / `num_last_layers_in_bf16` | those decoder layers stay BF16 |
| `vllm_cfg.quantization_ignored_layer_kws` | modules whose name contains a keyword stay BF16 |
| `vllm_cfg.is_mx` | MXFP8: rejected (not an exact scheme of this bridge) |
| `refit.bucket_size_mb`, `refit.verify` | bucket bound and receiver-side verification |

Always BF16: embeddings, norms (incl. q/k norms), `lm_head`, the MoE router (`mlp.gate`), biases.
Only decoder-layer `*_proj.weight` matrices are FP8 candidates.

With block scaling, vLLM needs fused shards (q, k of `qkv_proj`; gate of `gate_up_proj`) with
N % 128 == 0, because it writes a shard's scale rows at `ceil(offset/128)`. When the plan is
built with shapes and `target="vllm"` (the default), such groups stay BF16 and are listed in
`ignored_layers` (vLLM requires all shards of a fused module to agree); `VllmReceiver` refuses
a refit that still has them. `target="module"` (a transformers model, e.g. the embedded
engine) has no such constraint: pass it so small models keep every projection in FP8.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.refit.names import layer_index

Scheme = Literal["bf16", "block", "tensor", "channel"]
Target = Literal["vllm", "module"]
BLOCK = 128
_PROJ = re.compile(r"^model\.layers\.\d+\..*_proj\.weight$")
_QKV = re.compile(r"^(.*\.self_attn)\.([qkv])_proj\.weight$")
_GATE_UP = re.compile(r"^(.*(?:\.mlp|\.experts\.\d+|\.shared_expert))\.(gate|up)_proj\.weight$")
_QUANT_TO_SCHEME: dict[str | None, Scheme] = {
    None: "block",
    "fp8": "block",
    "fp8_per_block": "block",
    "fp8_per_tensor": "tensor",
    "fp8_per_channel": "channel",
    "compressed-tensors": "channel",
}
_GRANULARITY = {"block": "blockwise", "tensor": "tensorwise", "channel": "per_channel"}


class RefitPlanError(UsageError, ValueError):
    """The recipe asks for a refit this bridge cannot produce exactly."""


def fused_group(name: str) -> tuple[str, int] | None:
    """`(fused module, shard index)` for q/k/v (`qkv_proj`, 0..2) and gate/up (`gate_up_proj`)."""
    match = _QKV.match(name)
    if match:
        return f"{match.group(1)}.qkv_proj", "qkv".index(match.group(2))
    match = _GATE_UP.match(name)
    if match:
        return f"{match.group(1)}.gate_up_proj", 0 if match.group(2) == "gate" else 1
    return None


def misaligned_block_shards(shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Names of fused shards vLLM cannot hold as block FP8: any shard but the last of
    `qkv_proj` (q, k) or `gate_up_proj` (gate) whose row count is not a multiple of 128."""
    out = []
    for name, shape in shapes.items():
        group = fused_group(name)
        if group is None:
            continue
        last = 2 if group[0].endswith(".qkv_proj") else 1
        if group[1] < last and shape[0] % BLOCK:
            out.append(name)
    return sorted(out)


def _get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node or node[part] is None:
            return default
        node = node[part]
    return node


@dataclass(frozen=True)
class RefitPlan:
    """Per-name decisions for one model: FP8 (with scale tensor) or BF16 pass-through."""

    scheme: Scheme
    scale: Literal["fp32", "pow2"] = "fp32"
    fp8_names: frozenset[str] = frozenset()
    bf16_names: frozenset[str] = frozenset()
    ignored_layers: tuple[str, ...] = ()
    bucket_bytes: int = 256 * 2**20
    verify: bool = True
    target: Target = "vllm"
    reasons: Mapping[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> FP8Spec | None:
        """The `FP8Spec` FP8 weights are quantized with (None for an all-BF16 plan)."""
        if self.scheme == "bf16":
            return None
        return FP8Spec(fmt="e4m3", granularity=_GRANULARITY[self.scheme], scale=self.scale)

    def is_fp8(self, name: str) -> bool:
        """True when the engine receives `name` as FP8 plus a scale tensor."""
        return name in self.fp8_names

    def scale_name(self, name: str) -> str:
        """Name of the scale tensor that travels with FP8 weight `name`.

        Block: `<name>_scale_inv` (vLLM `Fp8LinearMethod`); per-tensor and per-channel:
        `<module>.weight_scale` (vLLM per-tensor FP8 and compressed-tensors).
        """
        if self.scheme == "block":
            return name + "_scale_inv"
        return name.removesuffix("weight") + "weight_scale"

    def quantization_config(self) -> dict[str, Any] | None:
        """The `config.json` `quantization_config` an engine loading these tensors needs."""
        if self.scheme == "bf16":
            return None
        if self.scheme == "channel":
            return _compressed_tensors_channel(self.ignored_layers)
        config: dict[str, Any] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "ignored_layers": list(self.ignored_layers),
        }
        if self.scheme == "block":
            config["weight_block_size"] = [BLOCK, BLOCK]
        return config

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        param_names: Iterable[str] | Mapping[str, Sequence[int]],
        *,
        target: Target = "vllm",
        scheme: Scheme | None = None,
    ) -> RefitPlan:
        """Decide, per HF name in `param_names`, BF16 pass-through or FP8 (see module doc).

        `param_names` may map names to shapes; then block alignment of fused shards is checked
        now (for `target="vllm"`). `scheme` overrides what the recipe's keys select.
        """
        shapes = dict(param_names) if isinstance(param_names, Mapping) else None
        names = list(shapes or param_names)
        vllm = _get(config, "policy.generation.vllm_cfg", {})
        chosen = scheme or _scheme_from_config(config)
        refit = _get(config, "refit", {})
        common = dict(
            bucket_bytes=int(refit.get("bucket_size_mb", 256)) * 2**20,
            verify=bool(refit.get("verify", True)),
            target=target,
        )
        if chosen == "bf16":
            return cls(scheme="bf16", bf16_names=frozenset(names), **common)
        scale = "pow2" if _uses_pow2(vllm, chosen) else "fp32"
        fp8, reasons = select_quantized(names, vllm)
        if target == "vllm" and chosen == "block" and shapes is not None:
            fp8 = _drop_misaligned(fp8, shapes, reasons)
        ignored = _ignored_modules(names, fp8)
        return cls(
            scheme=chosen,
            scale=scale,
            fp8_names=frozenset(fp8),
            bf16_names=frozenset(n for n in names if n not in fp8),
            ignored_layers=ignored,
            reasons=reasons,
            **common,
        )


def _scheme_from_config(config: Mapping[str, Any]) -> Scheme:
    vllm = _get(config, "policy.generation.vllm_cfg", {})
    if str(vllm.get("precision", "bfloat16")).lower() != "fp8":
        return "bf16"
    if vllm.get("is_mx"):
        raise RefitPlanError(
            "policy.generation.vllm_cfg.is_mx",
            "MXFP8 rollout is not supported by this refit bridge",
            "set is_mx: false for block-scaled FP8",
        )
    quant = _get(config, "policy.generation.vllm_kwargs.quantization")
    if quant not in _QUANT_TO_SCHEME:
        raise RefitPlanError(
            "policy.generation.vllm_kwargs.quantization",
            f"{quant!r} is not an FP8 scheme the bridge can produce",
            f"use one of {sorted(k for k in _QUANT_TO_SCHEME if k)} or leave it unset",
        )
    return _QUANT_TO_SCHEME[quant]


def _uses_pow2(vllm: Mapping[str, Any], scheme: Scheme) -> bool:
    """Power-of-2 scales: asked for, or block weights that DeepGEMM may requantize (UE8M0).

    Power-of-2 scales are exact under both engine behaviours, so any sign of DeepGEMM
    (`use_deep_gemm`, or `VLLM_USE_DEEP_GEMM_E8M0=1` in `vllm_cfg.env_vars`) selects them.
    """
    if vllm.get("pow2_weight_scaling_factors"):
        return True
    env = {k: str(v) for k, v in (vllm.get("env_vars") or {}).items()}
    if env.get("VLLM_USE_DEEP_GEMM") == "0":
        return False
    deep_gemm = bool(vllm.get("use_deep_gemm")) or env.get("VLLM_USE_DEEP_GEMM_E8M0") == "1"
    return scheme == "block" and deep_gemm


def _layer_count(vllm: Mapping[str, Any], key: str) -> int:
    """`vllm_cfg.<key>` as a whole number of layers >= 0 (null: 0)."""
    value = vllm.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RefitPlanError(
            f"policy.generation.vllm_cfg.{key}",
            f"{value!r} is not a number of layers",
            "give a whole number >= 0 (0 keeps no layer in BF16)",
        )
    return value


def select_quantized(names: list[str], vllm: Mapping[str, Any]) -> tuple[set[str], dict[str, str]]:
    """The decoder linear weights a quantized rollout serves quantized (vLLM's rules: not the
    router, not the first/last `num_*_layers_in_bf16`, not `quantization_ignored_layer_kws`,
    every shard of a fused module alike), and for each other name the reason it stays BF16."""
    layers = [i for i in map(layer_index, names) if i is not None]
    num_layers = max(layers) + 1 if layers else 0
    first = _layer_count(vllm, "num_first_layers_in_bf16")
    last = _layer_count(vllm, "num_last_layers_in_bf16")
    kws = list(vllm.get("quantization_ignored_layer_kws") or [])
    if not all(isinstance(kw, str) and kw.strip() for kw in kws):
        raise RefitPlanError(
            "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
            f"{kws!r} holds an empty "
            "or non-text keyword, which every layer name contains (so no layer would be FP8)",
            "give keywords that name modules, e.g. [lm_head, mlp.gate]",
        )
    fp8: set[str] = set()
    reasons: dict[str, str] = {}
    for name in names:
        idx = layer_index(name)
        module = name.removesuffix(".weight")
        if not _PROJ.match(name) or ".mlp.gate." in name:
            reasons[name] = "not a decoder linear weight"
        elif idx is not None and idx < first:
            reasons[name] = f"num_first_layers_in_bf16={first}"
        elif idx is not None and idx >= num_layers - last:
            reasons[name] = f"num_last_layers_in_bf16={last}"
        elif any(kw in module for kw in kws):
            reasons[name] = f"quantization_ignored_layer_kws {[kw for kw in kws if kw in module]}"
        else:
            fp8.add(name)
    # vLLM needs every shard of a fused module in the same precision.
    groups: dict[str, list[str]] = {}
    for name in names:
        group = fused_group(name)
        if group:
            groups.setdefault(group[0], []).append(name)
    for members in groups.values():
        if any(m not in fp8 for m in members):
            for m in members:
                if m in fp8:
                    fp8.discard(m)
                    reasons[m] = "a shard of the same fused module stays BF16"
    return fp8, reasons


def _drop_misaligned(
    fp8: set[str], shapes: Mapping[str, Sequence[int]], reasons: dict[str, str]
) -> set[str]:
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in fp8:
        group = fused_group(name)
        if group:
            groups.setdefault(group[0], []).append((group[1], name))
    kept = set(fp8)
    for module, members in groups.items():
        members.sort()
        heads = [shapes[n][0] for _, n in members[:-1]]
        if any(rows % BLOCK for rows in heads):
            for _, name in members:
                kept.discard(name)
                reasons[name] = (
                    f"{module}: shard rows {[shapes[n][0] for _, n in members]} not multiples of "
                    f"{BLOCK} (vLLM block scale rows would overlap)"
                )
    return kept


def _ignored_modules(names: list[str], fp8: set[str]) -> tuple[str, ...]:
    """Module names of linear weights kept BF16 (vLLM `ignored_layers`, exact HF prefixes)."""
    out = []
    for name in names:
        if _PROJ.match(name) and name not in fp8 and ".mlp.gate." not in name:
            out.append(name.removesuffix(".weight"))
    return tuple(sorted(out, key=_natural))


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _compressed_tensors_channel(ignored: Sequence[str]) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head", *ignored],
        "kv_cache_scheme": None,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "output_activations": None,
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "channel",
                    "symmetric": True,
                    "dynamic": False,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "symmetric": True,
                    "dynamic": True,
                },
            }
        },
    }
