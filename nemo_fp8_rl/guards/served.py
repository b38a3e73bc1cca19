"""FP8 active at run time: the generation side counts the linear layers it serves per precision.

At step 0 and after every refit the generation worker (vLLM's workers on a GPU, the CPU
generation worker, the embedded engine's rollout) reports each decoder linear layer it serves:

* `fp8-block`: an FP8 weight with a float32 `weight_scale_inv` of shape
  `(ceil(out / 128), ceil(in / 128))` (vLLM's block FP8; DeepGEMM may pad the scale grid up to a
  multiple of 4 rows, which is accepted);
* `mxfp8`: an FP8 weight with E8M0 (uint8 / float8_e8m0fnu) scales of `(out, in / 32)`:
  `weight_scale_from_checkpoint` where NeMo RL's MXFP8 refit keeps them, else `weight_scale`;
* `fp8-bad-scale`: an FP8 weight whose scale has another dtype or shape, or bad values: a block
  scale not finite or not positive, an E8M0 byte 255 (NaN), as an all-zero block quantized
  without its own case leaves them (slime PR #2256, NVIDIA-NeMo/RL PR #3477);
* `bf16`: anything else (the weight in BF16, FP16 or FP32);

and whether NeMo RL's FP8 patches are in place in the process that holds the layers (vLLM's
`Fp8LinearMethod.process_weights_after_loading` is NeMo RL's function; without it FP8 layers
lose their weight loaders and refits do not reach them, NVIDIA-NeMo/RL#3755).

`check_served` compares the counts with what the recipe asks: with `vllm_cfg.precision: fp8`
every layer is FP8 except those the recipe keeps BF16 (`num_first_layers_in_bf16`,
`num_last_layers_in_bf16`, `quantization_ignored_layer_kws`) and those vLLM never quantizes
(the MoE router `gate`; the LM head and embeddings are not linear layers here). A recipe whose
FP8 layers come up BF16, with a bad scale, or without the patches stops with a located error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import ProblemsError

FP8_BLOCK, MXFP8, BAD_SCALE, BF16 = "fp8-block", "mxfp8", "fp8-bad-scale", "bf16"
BLOCK, MX_BLOCK = 128, 32
ROUTER = re.compile(r"(^|\.)(mlp\.gate|router|gate)$")
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# vLLM's fused linear layers and the Hugging Face layers each loads (the models' packed_modules_
# mapping): NeMo RL matches quantization_ignored_layer_kws against Hugging Face names, and vLLM
# keeps a fused layer BF16 when every part it loads is ignored (`is_layer_skipped`)
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass
class ServedCounts:
    """What one generation worker serves: layer name -> precision, and the patch state."""

    layers: dict[str, str] = field(default_factory=dict)
    patched: bool | None = None  # NeMo RL's FP8 patches in place (None: not a NeMo RL worker)
    where: str = "generation worker"
    num_layers: int = 0  # decoder layers of the served model (for num_last_layers_in_bf16)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for precision in self.layers.values():
            out[precision] = out.get(precision, 0) + 1
        return out

    def describe(self) -> str:
        shown = ", ".join(f"{n} {p}" for p, n in sorted(self.counts().items()))
        patched = (
            ""
            if self.patched is None
            else f"; NeMo RL FP8 patches {'in place' if self.patched else 'MISSING'}"
        )
        return f"{self.where}: {shown or 'no linear layers'}{patched}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServedCounts:
        return cls(
            dict(data.get("layers", {})),
            data.get("patched"),
            data.get("where", "generation worker"),
            int(data.get("num_layers", 0)),
        )


def _is_fp8(dtype: Any) -> bool:
    return "float8_e4m3" in str(dtype) or "float8_e5m2" in str(dtype)


def classify(module: Any) -> str:
    """The precision one linear layer is served in (module docstring)."""
    weight = getattr(module, "weight", None)
    if weight is None or not _is_fp8(weight.dtype):
        return BF16
    out_f = int(getattr(module, "output_size_per_partition", 0) or weight.shape[0])
    in_f = int(getattr(module, "input_size_per_partition", 0) or weight.shape[-1])
    block = getattr(module, "weight_scale_inv", None)
    if block is not None and str(block.dtype) == "torch.float32" and block.dim() == 2:
        rows, cols = math.ceil(out_f / BLOCK), math.ceil(in_f / BLOCK)
        shaped = block.shape[1] == cols and rows <= block.shape[0] <= 4 * math.ceil(rows / 4)
        # an all-zero block quantized without its own case gives an inf/NaN or zero scale
        valid = bool(torch.isfinite(block).all()) and bool((block > 0).all())
        return FP8_BLOCK if shaped and valid else BAD_SCALE
    # NeMo RL's MXFP8 path keeps the checkpoint-layout E8M0 bytes as `weight_scale_from_checkpoint`
    # (vLLM's `weight_scale` is then its swizzled copy; the CPU generation worker holds only the
    # former)
    mx = getattr(module, "weight_scale_from_checkpoint", None)
    mx = getattr(module, "weight_scale", None) if mx is None else mx
    e8m0 = mx is not None and ("uint8" in str(mx.dtype) or "e8m0" in str(mx.dtype))
    if e8m0 and tuple(mx.shape)[-1] >= math.ceil(in_f / MX_BLOCK):
        # E8M0 byte 255 is NaN (an all-zero block's scale gone wrong, slime PR #2256)
        return MXFP8 if not bool((mx.view(torch.uint8) == 255).any()) else BAD_SCALE
    return BAD_SCALE


def served_layers(model: Any, linear_type: type | None = None) -> dict[str, str]:
    """{name: precision} of `model`'s decoder linear layers (instances of `linear_type`, or any
    module with a 2-D `weight` inside `layers.<i>.`)."""
    out = {}
    for name, module in model.named_modules():
        if not LAYER.search(f".{name}"):
            continue
        if linear_type is not None:
            if not isinstance(module, linear_type):
                continue
        else:
            weight = getattr(module, "weight", None)
            if (
                weight is None
                or getattr(weight, "dim", lambda: 0)() != 2
                or list(module.children())
            ):
                continue
        out[name] = classify(module)
    return out


def nemo_patches_in_place() -> bool | None:
    """Whether NeMo RL's FP8 patches are in place in this process: vLLM's
    `Fp8LinearMethod.process_weights_after_loading` is NeMo RL's (None: no NeMo RL or vLLM)."""
    try:
        from nemo_rl.models.generation.vllm.quantization import fp8 as nemo_fp8
        from vllm.model_executor.layers.quantization import fp8 as vllm_fp8
    except ImportError:
        return None
    return (
        vllm_fp8.Fp8LinearMethod.process_weights_after_loading
        is nemo_fp8.process_weights_after_loading
    )


def kept_bf16(name: str, vllm_cfg: dict[str, Any], num_layers: int) -> str | None:
    """Why the recipe keeps layer `name` BF16 (None: it should be FP8)."""
    if ROUTER.search(name):
        return "MoE router (vLLM never quantizes it)"
    kws = vllm_cfg.get("quantization_ignored_layer_kws") or []
    for kw in kws:
        if kw in name:
            return f"quantization_ignored_layer_kws {kw!r}"
    head, _, leaf = name.rpartition(".")
    parts = [f"{head}.{p}" if head else p for p in FUSED_PARTS.get(leaf, ())]
    matched = [next((kw for kw in kws if kw in part), None) for part in parts]
    if parts and None not in matched:
        return f"quantization_ignored_layer_kws {sorted(set(matched))} (each part of {leaf})"
    found = LAYER.search(f".{name}")
    if found:
        index = int(found.group(1))
        if index < int(vllm_cfg.get("num_first_layers_in_bf16") or 0):
            return "num_first_layers_in_bf16"
        last = int(vllm_cfg.get("num_last_layers_in_bf16") or 0)
        if last and index >= num_layers - last:
            return "num_last_layers_in_bf16"
    return None


class ServedPrecisionError(ProblemsError, RuntimeError):
    """The generation side does not serve the precision the recipe asks for: the user's to fix
    (the recipe, the environment that serves it), reported located with every wrong layer."""

    def __init__(self, where: str, problems: list[str], fix: str) -> None:
        what = (
            "the generation engine does not serve what the recipe says "
            "[served-precision, NVIDIA-NeMo/RL#3755]"
        )
        super().__init__(where, what, problems, fix)


def expected_precision(vllm_cfg: dict[str, Any], low_bit: str | None = None) -> str:
    """The precision the recipe's quantized layers must be served in (`bf16`: none quantized);
    `low_bit` names a 4-bit format the embedded engine emulates (`local.fp4`)."""
    if low_bit:
        return low_bit
    if vllm_cfg.get("precision") != "fp8":
        return BF16
    return MXFP8 if vllm_cfg.get("is_mx") else FP8_BLOCK


def served_problems(
    served: ServedCounts, vllm_cfg: dict[str, Any], low_bit: str | None = None
) -> list[str]:
    """Every way `served` differs from what `vllm_cfg` asks (empty: as the recipe says)."""
    want = expected_precision(vllm_cfg, low_bit)
    if want == BF16:
        quantized = [n for n, p in served.layers.items() if p != BF16]
        return [f"{n}: served {served.layers[n]}, the recipe's rollout is BF16" for n in quantized]
    problems = []
    if served.patched is False and not low_bit:
        problems.append(
            f"{served.where}: NeMo RL's FP8 patches are not in place in the process serving the "
            "model (vLLM's Fp8LinearMethod.process_weights_after_loading is vLLM's own): its FP8 "
            "layers lose their weight loaders and refits do not reach them"
        )
    for name, precision in sorted(served.layers.items()):
        why = kept_bf16(name, vllm_cfg, served.num_layers)
        if precision == want or (why is not None and precision == BF16):
            continue
        expect = f"expected {want}" if why is None else f"expected BF16 ({why})"
        problems.append(f"{name}: served {precision}, {expect}")
    return problems


def check_served(
    reports: Iterable[ServedCounts],
    vllm_cfg: dict[str, Any],
    when: str,
    low_bit: str | None = None,
) -> list[str]:
    """Raise `ServedPrecisionError` naming every wrong layer of every worker; else the one-line
    description of each worker's counts (for the log)."""
    reports = list(reports)
    problems = [p for r in reports for p in served_problems(r, vllm_cfg, low_bit)]
    if problems:
        raise ServedPrecisionError(
            f"policy.generation.vllm_cfg.precision ({when})",
            problems,
            "check that NeMo RL's FP8 patches reach the engine's workers (`nemo_fp8_rl.train "
            "--preflight` runs the fp8-active check; set policy.generation.vllm_cfg.env_vars."
            "VLLM_USE_RAY_V2_EXECUTOR_BACKEND: '0' on vLLM 0.25), and that vllm_kwargs does not "
            "override NeMo RL's quantization or hf_overrides",
        )
    return [r.describe() for r in reports]
