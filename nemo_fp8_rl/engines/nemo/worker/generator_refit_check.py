"""The refit-metadata check of `refit.quantize_on: generator`, against vLLM's served model.

NeMo RL's `VllmInternalWorkerExtension.prepare_refit_info` only stores the metadata the policy
sends (`{name: (shape, dtype)}`, Hugging Face names, BF16); a weight of another shape then fails
inside vLLM's weight loader midway through a refit, after earlier tensors were copied. The
project's extensions check the metadata first, in `prepare_refit_info`, so a bad refit is refused
before any weight moves (the trainer path's check is `vllm_refit.check_refit_info`).

The check resolves each name the way vLLM's loader does for its dense layers: the model's
`hf_to_vllm_mapper` renames it (with vLLM 0.25 also a part of a fused layer, `q_proj` ->
`qkv_proj` shard "q"); otherwise a part of a fused layer (`q_proj` of `qkv_proj`, `gate_proj`
of `gate_up_proj`: the model's `packed_modules_mapping`) names its shard. For a name that resolves to
a layer, the full (unsharded) shape is known from the layer's own sizes, independent of tensor
parallelism and of the kernel's weight layout after loading:

    QKV shard i:           ([H*d, K*d, K*d_v][i], in)    H, K heads and kv heads, d head size
    merged shard i:        (output_sizes[i], in)
    other linear layers:   (output_size, in)
    vocabulary embedding:  (org_vocab_size, embedding_dim)
    anything else:         the parameter's own shape (norm weights: never sharded)

and the entry's shape must equal it (a bias: its first dimension). No entry may be FP8: on this
path vLLM quantizes what it receives. Names that resolve to no layer (routed experts, names vLLM's
loader skips or renames in its own `load_weights`) are left to vLLM's loader, so no model that
loads today is refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_fp8_rl.refit.errors import RefitMismatch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


METADATA = "the refit metadata does not match vLLM's model"
METADATA_FIX = (
    "serve the model the policy trains (policy.model_name and policy.generation as loaded), "
    "from one recipe"
)


def _fused_parts(model: Any) -> dict[str, tuple[str, int]]:
    """`q_proj` -> (`qkv_proj`, 0), ... from the model's `packed_modules_mapping`."""
    parts: dict[str, tuple[str, int]] = {}
    for fused, names in (getattr(model, "packed_modules_mapping", None) or {}).items():
        for i, part in enumerate(names):
            parts[part] = (fused, i)
    return parts


QKV_SHARDS = {"q": 0, "k": 1, "v": 2}


def _vllm_name(model: Any, name: str) -> tuple[str, int | None] | None:
    """`name` as vLLM's loader renames it, with the shard of a fused layer when the renaming
    says it (vLLM 0.25's stacked renamings: `q_proj` -> `qkv_proj`, shard "q"); None: the
    loader drops it."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    with_shard = getattr(mapper, "_map_name_with_shard", None)
    if callable(with_shard):
        mapped = with_shard(name)
        if mapped is None:
            return None
        new, shard = mapped
        return new, QKV_SHARDS.get(shard, shard) if isinstance(shard, str) else shard
    rename = getattr(mapper, "_map_name", None)
    new = rename(name) if callable(rename) else name
    return None if new is None else (new, None)


def _full_shape(module: Any, shard: int | None) -> tuple[int, ...] | None:
    """The unsharded weight shape of a vLLM layer (module docstring), None when unknown."""
    if hasattr(module, "total_num_heads") and hasattr(module, "head_size") and shard is not None:
        d_v = getattr(module, "v_head_size", module.head_size)
        kv = module.total_num_kv_heads
        out = (module.total_num_heads * module.head_size, kv * module.head_size, kv * d_v)
        return (out[shard], module.input_size)
    if hasattr(module, "output_sizes") and shard is not None:
        return (module.output_sizes[shard], module.input_size)
    if hasattr(module, "input_size") and hasattr(module, "output_size"):
        return (module.output_size, module.input_size)
    if hasattr(module, "org_vocab_size") and hasattr(module, "embedding_dim"):
        return (module.org_vocab_size, module.embedding_dim)
    return None


def _expected(model: Any, modules: Mapping[str, Any], name: str) -> tuple[int, ...] | None:
    """The shape vLLM's model needs for metadata entry `name`; None: not one of its layers."""
    mapped = _vllm_name(model, name)
    if mapped is None or "." not in mapped[0]:
        return None
    path, leaf = mapped[0].rsplit(".", 1)
    owner, _, last = path.rpartition(".")
    shard = mapped[1]
    if shard is None and last in (parts := _fused_parts(model)):
        fused, shard = parts[last]
        path = f"{owner}.{fused}" if owner else fused
    module = modules.get(path)
    if module is None:
        return None
    full = _full_shape(module, shard)
    if full is None:
        param = getattr(module, leaf, None)
        return tuple(param.shape) if isinstance(param, torch.Tensor) else None
    return full[:1] if leaf == "bias" else full


def generator_refit_problems(info: Mapping[str, tuple[Any, torch.dtype]], model: Any) -> list[str]:
    """Every way the metadata disagrees with vLLM's `model` (empty: it matches)."""
    modules = dict(model.named_modules())
    problems: list[str] = []
    for name, (shape, dtype) in info.items():
        if dtype in FP8_DTYPES:
            problems.append(
                f"{name}: {dtype} sent where vLLM quantizes on receipt (refit.quantize_on: "
                "generator); send BF16 or use refit.quantize_on: trainer"
            )
            continue
        want = _expected(model, modules, name)
        got = tuple(int(d) for d in shape)
        if want is not None and got != tuple(int(d) for d in want):
            problems.append(f"{name}: shape {list(got)}, vLLM's model holds {list(want)}")
    return problems


class GeneratorRefitCheck:
    """`prepare_refit_info` that checks the whole metadata against the served model first
    (mixed in before NeMo RL's `VllmInternalWorkerExtension`)."""

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Refuse metadata that disagrees with the model, then store it as NeMo RL does."""
        problems = generator_refit_problems(state_dict_info, self.model_runner.model)  # type: ignore[attr-defined]
        if problems:
            raise RefitMismatch("prepare_refit_info", METADATA, problems, METADATA_FIX)
        super().prepare_refit_info(state_dict_info)  # type: ignore[misc]
