"""Checks on the BF16 checkpoint an export reads: every shard there, a model the bridge maps, and
a `config.json` that describes the tensors.

- Shards: with `model.safetensors.index.json` the checkpoint is exactly the files its
  `weight_map` names (as transformers and vLLM load it); a named file that is missing, a tensor
  the index places in a shard that does not hold it, or a tensor no index entry names is
  refused, so an export is never half a model. Without an index, every `*.safetensors` file.
- Architecture: `architectures` (else `model_type`) must be one the name mapping knows
  (`SUPPORTED`); anything else would pass through unconverted.
- Shapes: the fields that fix tensor shapes must agree with the tensors, since the export keeps
  the source's `config.json` and the engine builds the model from it:
  `vocab_size`, `hidden_size` = embedding `[vocab_size, hidden_size]`; `num_hidden_layers` =
  number of `model.layers.<i>`; q rows = `num_attention_heads * head_dim`, k and v rows =
  `num_key_value_heads * head_dim` (`head_dim` = `hidden_size / num_attention_heads` when unset);
  dense `gate_proj`/`up_proj` rows = `intermediate_size`; expert ones = `moe_intermediate_size`,
  and experts per layer = `num_experts`; `tie_word_embeddings: false` needs an `lm_head.weight`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_fp8_rl.refit.safe_output import INDEX, ExportError

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_PROJ = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.weight$")
_OUT = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.o_proj|mlp\.down_proj)\.weight$")
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(?:gate|up)_proj\.weight$")


def _index(src: Path) -> dict[str, str] | None:
    """The index's `weight_map` (tensor -> file), or None for a checkpoint without an index."""
    path = src / INDEX
    if not path.exists():
        return None
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(
            path, f"not a safetensors index ({type(exc).__name__}: {exc})", "restore the file"
        ) from exc
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) and "/" not in v for v in weight_map.values()
    ):
        raise ExportError(path, "weight_map is not a map of tensor -> file name", "restore it")
    if not weight_map:
        raise ExportError(
            path, "weight_map is empty: the index names no tensor", "restore the index file"
        )
    return weight_map


# The dtypes of a BF16 source (an FP32 or FP16 checkpoint converts as well); anything else
# (F8_E4M3, I8, ...) is already quantized or not a weight this export can convert.
SOURCE_DTYPES = frozenset({"BF16", "F16", "F32"})
# Tensors only a quantized checkpoint holds: a BF16 `*_scale_inv` would be exported as the
# scale of its weight (a tensor of ones: a silently wrong model).
_QUANTIZED = re.compile(r"(_scale_inv|\.weight_scale|\.input_scale|\.weight_zero_point)$")


def repeated_tensor(file: Path, name: str, first: str) -> ExportError:
    """Two shards holding the same tensor: which copy a loader keeps is not defined."""
    return ExportError(
        file,
        f"holds {name}, which {first} holds too",
        "keep each tensor in one shard (re-download the checkpoint)",
    )


def check_source_tensor(file: Path, name: str, dtype: str) -> None:
    """Refuse a tensor a BF16 source does not hold: a scale (pre-quantized) or another dtype."""
    if _QUANTIZED.search(name):
        raise ExportError(
            file,
            f"holds {name}, a quantization scale: the checkpoint is already quantized",
            "export the BF16 checkpoint it was quantized from",
            2,
        )
    if dtype not in SOURCE_DTYPES:
        raise ExportError(
            file,
            f"{name} is {dtype}, not a BF16, FP16 or FP32 weight (already quantized?)",
            "export the BF16 checkpoint",
            2,
        )


def checkpoint_files(src: Path) -> list[Path]:
    """The safetensors files of the checkpoint: those the index names, else every one."""
    weight_map = _index(src)
    if weight_map is None:
        files = sorted(src.glob("*.safetensors"))
        if not files:
            raise ExportError(
                src, "no *.safetensors files", "convert .bin checkpoints to safetensors first", 2
            )
        return files
    names = sorted(set(weight_map.values()))
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise ExportError(
            src / missing[0],
            f"missing: {INDEX} names {len(names)} shard(s) and {len(missing)} are absent "
            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); nothing was written",
            "copy or re-download the missing shard(s) into the checkpoint folder",
        )
    return [src / n for n in names]


def check_index(src: Path, found: Mapping[str, str]) -> None:
    """The tensors found in the shards (`tensor -> file`) are exactly those the index names."""
    weight_map = _index(src)
    if weight_map is None:
        return
    absent = sorted(t for t, f in weight_map.items() if found.get(t) != f)
    extra = sorted(t for t in found if t not in weight_map)
    if absent or extra:
        first = absent[0] if absent else extra[0]
        what = (
            f"{INDEX} places {first} in {weight_map[first]}, which does not hold it"
            if absent
            else f"{found[first]} holds {first}, which {INDEX} does not name"
        )
        raise ExportError(
            src / INDEX,
            f"{what} ({len(absent)} named but absent, {len(extra)} unnamed)",
            "re-download the checkpoint so that index and shards belong together",
        )


def check_architecture(config: Mapping[str, Any], config_path: Path) -> None:
    """Refuse a model whose `architectures` (or `model_type`) the name mapping does not know."""
    archs = config.get("architectures")
    supported = ", ".join(SUPPORTED)
    if isinstance(archs, list) and archs:
        unknown = [a for a in archs if a not in SUPPORTED]
        if not unknown:
            return
        what = f"architecture {', '.join(map(str, unknown))} is not one the refit bridge maps"
    elif config.get("model_type") in SUPPORTED.values():
        return
    elif "model_type" in config:
        what = f"model_type {config['model_type']!r} is not one the refit bridge maps"
    else:
        what = "names no architecture (neither architectures nor model_type)"
    raise ExportError(
        config_path, what, f"export a model of a supported architecture ({supported})", 2
    )


def _expected(config: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Per tensor kind, the (config field, rows) the config implies; fields it lacks are left out."""
    out: dict[str, tuple[str, int]] = {}
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        head_dim = config.get("head_dim") or hidden // heads
        kv = config.get("num_key_value_heads") or heads
        out["self_attn.q_proj"] = ("num_attention_heads * head_dim", heads * head_dim)
        out["self_attn.k_proj"] = out["self_attn.v_proj"] = (
            "num_key_value_heads * head_dim",
            kv * head_dim,
        )
    if "self_attn.q_proj" in out:
        out["self_attn.o_proj"] = out["self_attn.q_proj"]
    if isinstance(config.get("intermediate_size"), int):
        out["mlp.down_proj"] = ("intermediate_size", config["intermediate_size"])
        out["mlp.gate_proj"] = out["mlp.up_proj"] = (
            "intermediate_size",
            config["intermediate_size"],
        )
    return out


def shape_problems(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Each config field that disagrees with the tensors, once, with the first tensor that shows it."""
    problems: dict[str, str] = {}

    def note(field: str, text: str) -> None:
        problems.setdefault(field, f"{field} is {text}")

    embed = shapes.get("model.embed_tokens.weight")
    for field, dim in (("vocab_size", 0), ("hidden_size", 1)):
        value = config.get(field)
        if embed is not None and len(embed) == 2 and value is not None and value != embed[dim]:
            shape = list(embed)
            note(field, f"{value} but model.embed_tokens.weight is {shape} ({field} {embed[dim]})")
    layers = {int(m.group(1)) for n in shapes if (m := _LAYER.match(n))}
    declared = config.get("num_hidden_layers")
    if layers and declared is not None and declared != len(layers):
        note("num_hidden_layers", f"{declared} but the tensors hold {len(layers)} layers")
    expected = _expected(config)
    hidden, moe_rows = config.get("hidden_size"), config.get("moe_intermediate_size")
    experts: dict[int, set[int]] = defaultdict(set)
    for name, shape in sorted(shapes.items()):
        if m := _PROJ.match(name):
            field, rows = expected.get(m.group(2), (None, None))
            if field is not None and shape[0] != rows:
                note(field, f"{rows} but {name} has {shape[0]} rows")
            if hidden is not None and len(shape) == 2 and shape[1] != hidden:
                note("hidden_size", f"{hidden} but {name} has {shape[1]} columns")
        elif m := _EXPERT.match(name):
            experts[int(m.group(1))].add(int(m.group(2)))
            if moe_rows is not None and shape[0] != moe_rows:
                note("moe_intermediate_size", f"{moe_rows} but {name} has {shape[0]} rows")
    for name, shape in sorted(shapes.items()):  # after the inputs: a wrong field shows there
        if (m := _OUT.match(name)) and len(shape) == 2:  # o_proj, down_proj: [hidden, inner]
            field, cols = expected.get(m.group(2), (None, None))
            if hidden is not None and shape[0] != hidden:
                note("hidden_size", f"{hidden} but {name} has {shape[0]} rows (transposed?)")
            if field is not None and shape[1] != cols:
                note(field, f"{cols} but {name} has {shape[1]} columns (transposed?)")
    untied = config.get("tie_word_embeddings") is False
    if untied and embed is not None and "lm_head.weight" not in shapes:
        note("tie_word_embeddings", "false but the tensors hold no lm_head.weight")
    count = config.get("num_experts")
    for layer, found in sorted(experts.items()):
        if count is not None and len(found) != count:
            note("num_experts", f"{count} but layer {layer} holds {len(found)} experts")
    return list(problems.values())


def check_shapes(
    config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], config_path: Path
) -> None:
    """Refuse a `config.json` whose shape fields disagree with the tensors (see module doc)."""
    problems = shape_problems(config, shapes)
    if problems:
        raise ExportError(
            config_path,
            "does not describe the tensors: " + "; ".join(problems),
            "use the config.json saved with these weights",
            2,
        )
