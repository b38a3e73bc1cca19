"""FP8 checkpoint export: safetensors shards + `config.json` with `quantization_config`.

Shards are the refit stream's buckets (each ≤ `shard_bytes`, so memory stays one shard), named
`model-XXXXX-of-YYYYY.safetensors` with a `model.safetensors.index.json` weight map, as
transformers and vLLM expect. Block scheme: `quantization_config = {quant_method: fp8, fmt: e4m3,
activation_scheme: dynamic, weight_block_size: [128, 128], ignored_layers, modules_to_not_convert}`;
per-tensor omits the block size; per-channel writes the compressed-tensors channel format.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.names import hf_to_engine
from nemo_fp8_rl.refit.plan import RefitPlan
from nemo_fp8_rl.refit.safe_output import (
    ExportError,
    check_output_path,
    check_target,
    write_swapped,
)
from nemo_fp8_rl.refit.source import (
    check_architecture,
    check_index,
    check_shapes,
    check_source_tensor,
    checkpoint_files,
    repeated_tensor,
)
from nemo_fp8_rl.refit.stream import stream_refit

NamedTensor = tuple[str, torch.Tensor]
_SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def _shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def export_checkpoint(
    named_tensors: Iterable[NamedTensor],
    plan: RefitPlan,
    out_dir: str | Path,
    config: Mapping[str, Any],
    *,
    shard_bytes: int = 4 * 2**30,
) -> Path:
    """Write `named_tensors` (HF names) as an engine checkpoint per `plan` into `out_dir`.

    `config` is the model's HF `config.json` content; its `quantization_config` is replaced by
    the plan's (removed for a BF16 plan) and `dtype` / `torch_dtype` set to bfloat16. Returns `out_dir`.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    weight_map: dict[str, int] = {}
    total = 0
    for bucket in stream_refit(named_tensors, plan, bucket_bytes=shard_bytes):
        part = out / f"part-{bucket.index}.tmp"  # out: write_swapped's new temporary folder
        save_file(bucket.tensors, part, metadata={"format": "pt"})  # safe-write: private
        weight_map.update(dict.fromkeys(bucket.tensors, bucket.index))
        total += bucket.nbytes
        count = bucket.index + 1
    for i in range(count):
        (out / f"part-{i}.tmp").rename(out / _shard_name(i, count))  # safe-write: rename
    index = {
        "metadata": {"total_size": total},
        "weight_map": {name: _shard_name(i, count) for name, i in sorted(weight_map.items())},
    }
    write_atomic(out / "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")
    write_atomic(out / "config.json", json.dumps(engine_config(config, plan), indent=2) + "\n")
    return out


def engine_config(config: Mapping[str, Any], plan: RefitPlan) -> dict[str, Any]:
    """The HF config the engine loads: `config` plus the plan's `quantization_config`, its dtype
    bfloat16 under both names (`dtype` for transformers 5, `torch_dtype` before it): the tensors
    that are not FP8 are BF16, and two names with two values would contradict each other."""
    result = {k: v for k, v in config.items() if k != "quantization_config"}
    result["dtype"] = result["torch_dtype"] = "bfloat16"
    quant = plan.quantization_config()
    if quant is not None:
        if quant["quant_method"] == "fp8":
            quant["modules_to_not_convert"] = ["lm_head", *quant["ignored_layers"]]
        result["quantization_config"] = quant
    return result


def _unreadable(file: Path, exc: Exception) -> ExportError:
    return ExportError(
        file,
        f"not a readable safetensors file, truncated or corrupted ({exc})",
        "re-save or re-download the checkpoint",
    )


def read_hf_checkpoint(src: str | Path) -> Iterator[NamedTensor]:
    """Stream the tensors of an HF safetensors checkpoint directory one at a time."""
    from safetensors import safe_open

    for file in checkpoint_files(Path(src)):
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
                for name in names:
                    tensor = f.get_tensor(name)
                    yield name, tensor
        except (ExportError, RefitError, GeneratorExit):
            raise
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error type)
            raise _unreadable(file, exc) from exc


def checkpoint_shapes(src: str | Path, *, bf16_source: bool = True) -> dict[str, tuple[int, ...]]:
    """HF names → shapes of a safetensors checkpoint, read from headers only; the shards must
    be exactly those its index names, holding exactly the tensors it names (`source`).

    `bf16_source` (an export's input) also refuses scales and non-float dtypes; an engine's
    served checkpoint (FP8 weights and their scales) is read with `bf16_source=False`."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    found: dict[str, str] = {}
    for file in checkpoint_files(Path(src)):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118
                    if name in found:
                        raise repeated_tensor(file, name, found[name])
                    header = f.get_slice(name)
                    if bf16_source:
                        check_source_tensor(file, name, header.get_dtype())
                    shapes[name] = tuple(header.get_shape())
                    found[name] = file.name
        except ExportError:
            raise
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error type)
            raise _unreadable(file, exc) from exc
    check_index(Path(src), found)
    return shapes


def _read_config(src: Path) -> dict[str, Any]:
    """The source's `config.json`: present, JSON, a BF16 (not yet quantized) model."""
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ExportError(src, "no config.json", "pass a Hugging Face checkpoint directory", 2)
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExportError(config_path, f"not valid JSON ({exc})", "restore the file", 2) from exc
    if not isinstance(config, dict):
        raise ExportError(config_path, "not a JSON object", "restore the file", 2)
    if "quantization_config" in config:
        method = (config["quantization_config"] or {}).get("quant_method")
        raise ExportError(config_path, f"already quantized ({method})", "pass a BF16 checkpoint", 2)
    return config


def convert_checkpoint(
    src: str | Path,
    out_dir: str | Path,
    recipe_config: Mapping[str, Any],
    *,
    shard_bytes: int = 4 * 2**30,
) -> RefitPlan:
    """Convert a BF16 HF checkpoint directory into the engine's FP8 layout; return the plan used.

    The source is checked first (`source`: every shard its index names, an architecture the
    bridge maps, a `config.json` that describes the tensors). Tokenizer and generation files
    are copied; the plan comes from the recipe's NeMo RL keys
    (`RefitPlan.from_config`, with shapes so misaligned fused modules stay BF16). The export is
    built beside `out_dir` and swapped in only when complete and verified (`safe_output`); an
    `ExportError` names the file and what to do, and leaves `out_dir` as it was.
    """
    src, out = Path(src), Path(out_dir)
    if not src.is_dir():
        raise ExportError(
            src, "no such checkpoint folder", "pass a Hugging Face checkpoint directory", 2
        )
    check_output_path(out)
    if src.resolve() == out.resolve() or src.resolve() in out.resolve().parents:
        raise ExportError(
            out, "is the source checkpoint (or inside it)", "export to another folder", 2
        )
    config = _read_config(src)
    check_architecture(config, src / "config.json")
    check_target(out, _SIDE_FILES)
    shapes = dict(hf_shapes(checkpoint_shapes(src)))
    check_shapes(config, shapes, src / "config.json")
    plan = RefitPlan.from_config(recipe_config, shapes)
    if plan.scheme != "bf16" and not plan.fp8_names:
        why = sorted(set(plan.reasons.values()))[:3]
        raise ExportError(
            out,
            f"an {plan.scheme} FP8 export would hold no FP8 weight (every one stays BF16: "
            f"{'; '.join(why) or 'no decoder linear weight'}); nothing was written",
            "lower --first-bf16 / --last-bf16 (num_first/last_layers_in_bf16) below the model's "
            "layer count, or export BF16",
            2,
        )

    def write(tmp: Path) -> None:
        try:
            export_checkpoint(
                hf_to_engine(read_hf_checkpoint(src)), plan, tmp, config, shard_bytes=shard_bytes
            )
        except RefitError as exc:
            raise ExportError(
                src,
                "weights fail verification: " + "; ".join(exc.problems[:5]),
                f"fix the source checkpoint; {out} was left as it was",
            ) from exc
        for name in _SIDE_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)  # safe-write: private

    write_swapped(out, write)
    return plan


def hf_shapes(shapes: Mapping[str, tuple[int, ...]]) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Shapes under engine names (fused transformers-5 experts split per expert)."""
    for name, shape in shapes.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")) and len(shape) == 3:
            meta = torch.empty(shape, device="meta")
            for sub, t in hf_to_engine([(name, meta)]):
                yield sub, tuple(t.shape)
        else:
            yield name, shape
