"""Generator-side FP8 refit (`refit.quantize_on: trainer`): FP8 pairs checked, then loaded as sent.

NeMo RL's vLLM worker quantizes each FP8 weight it receives (`fp8.load_weights`:
`cast_tensor_to_fp8_blockwise`, then `model.load_weights`). With `trainer` the pairs arrive
quantized and `load_prequantized` hands them to `model.load_weights` unchanged: no
requantization, no FP8 -> float -> FP8 round trip.

Nothing is applied from a payload that does not match what vLLM holds:

* `check_refit_info` runs on the whole metadata (`prepare_refit_info`, once, before the first
  refit): every name vLLM holds in FP8 arrives as float8_e4m3fn with a float32 `_scale_inv` of
  shape (ceil(m/128), ceil(n/128)), or with `mx=True` (NeMo RL's `is_mx`) a uint8
  `_scale_from_checkpoint` of shape (m, n/32); no FP8 tensor goes where vLLM holds a higher
  precision; no scale without its FP8 weight; no grouped MoE expert slab vLLM holds in FP8
  arrives unexpanded (with MXFP8, none arrives at all: NeMo RL refuses them).
* `check_chunk` runs on each transfer chunk before `model.load_weights`: every tensor is one the
  metadata announced, with its shape and dtype. Both transports rebuild tensors from that
  metadata, so a checked metadata plus checked chunks is a checked payload.

`holds_fp8(name)` says whether vLLM holds `name` in FP8 (the extension answers with NeMo RL's
own `_is_fp8_weight`). This module imports neither NeMo RL nor vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from nemo_fp8_rl.refit.errors import RefitMismatch

SCALE_SUFFIX = "_scale_inv"
MX_SCALE_SUFFIX = "_scale_from_checkpoint"
BLOCK = 128
MX_BLOCK = 32
DRAFT_PREFIX = "draft."
GROUPED_SLABS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
FP8 = torch.float8_e4m3fn

HoldsFp8 = Callable[[str], bool]
RefitInfo = Mapping[str, tuple[Any, torch.dtype]]


PAYLOAD = "the trainer-quantized FP8 refit does not match vLLM's model"
PAYLOAD_FIX = (
    "run both workers from the same recipe (refit.quantize_on and policy.generation.vllm_cfg "
    "as loaded), or set refit.quantize_on: generator"
)


def scale_shape(shape: Sequence[int]) -> tuple[int, int]:
    """Block-scale grid of a 2-D weight: (ceil(m/128), ceil(n/128))."""
    m, n = (int(d) for d in shape)
    return math.ceil(m / BLOCK), math.ceil(n / BLOCK)


def _dims(shape: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _scale_problems(
    name: str, base: str, shape: tuple[int, ...], dtype: torch.dtype, info: RefitInfo, mx: bool
) -> list[str]:
    """What is wrong with the scale entry `name` of FP8 weight `base` (empty: fine)."""
    weight = _dims(info[base][0])
    if mx:
        want = (
            (*weight[:-1], weight[-1] // MX_BLOCK) if weight and not weight[-1] % MX_BLOCK else None
        )
        kind, scale_dtype = "1x32 MXFP8 blocks", torch.uint8
    else:
        want = scale_shape(weight) if len(weight) == 2 else None
        kind, scale_dtype = "128x128 blocks", torch.float32
    out = []
    if dtype != scale_dtype:
        out.append(f"{name}: dtype {dtype}, vLLM loads these scales as {scale_dtype}")
    if want is not None and shape != want:
        out.append(f"{name}: shape {list(shape)}, the weight's {kind} need {list(want)}")
    if mx and want is None:
        out.append(f"{name}: the weight {base} {list(weight)} is no whole number of 1x32 blocks")
    return out


def _entry_problems(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    info: RefitInfo,
    holds_fp8: HoldsFp8,
    mx: bool = False,
) -> list[str]:
    """What is wrong with one metadata entry (empty: fine)."""
    suffix = MX_SCALE_SUFFIX if mx else SCALE_SUFFIX
    if name.startswith(DRAFT_PREFIX):
        return []
    if name.endswith(GROUPED_SLABS):
        if holds_fp8(name):
            what = "sent (NeMo RL's MXFP8 refit refuses them)" if mx else "sent unexpanded"
            return [f"{name}: grouped expert slab {what}; vLLM holds these experts in FP8"]
        return []
    other = SCALE_SUFFIX if mx else MX_SCALE_SUFFIX
    if name.endswith(other):
        return [f"{name}: a {other} scale where vLLM loads {suffix} scales"]
    if name.endswith(suffix):
        base = name[: -len(suffix)]
        if base not in info or not holds_fp8(base):
            return [f"{name}: unexpected name: vLLM holds no FP8 weight {base} for this scale"]
        return _scale_problems(name, base, shape, dtype, info, mx)
    if holds_fp8(name):
        if dtype != FP8:
            return [
                f"{name}: {dtype} tensor where vLLM holds float8_e4m3fn (not quantized on the trainer)"
            ]
        out = []
        if len(shape) != 2:
            out.append(f"{name}: shape {list(shape)}, FP8 weights are 2-D")
        if name + suffix not in info:
            out.append(f"{name}: missing scale {name}{suffix}")
        return out
    if dtype == FP8:
        return [f"{name}: float8_e4m3fn tensor where vLLM holds this weight in higher precision"]
    return []


def check_refit_info(
    info: RefitInfo, holds_fp8: HoldsFp8, where: str = "prepare_refit_info", *, mx: bool = False
) -> None:
    """Raise `RefitMismatch` listing every problem of the whole refit metadata (`mx`: the
    MXFP8 pairs of NeMo RL's `is_mx`)."""
    problems: list[str] = []
    for name, (shape, dtype) in info.items():
        problems += _entry_problems(name, _dims(shape), dtype, info, holds_fp8, mx)
    if problems:
        raise RefitMismatch(where, PAYLOAD, problems, PAYLOAD_FIX)


def check_chunk(
    weights: Sequence[tuple[str, torch.Tensor]], info: RefitInfo, where: str = "refit chunk"
) -> None:
    """Raise `RefitMismatch` unless every tensor is one `info` announced, as announced."""
    problems: list[str] = []
    seen: set[str] = set()
    for name, tensor in weights:
        if name in seen:
            problems.append(f"{name}: sent twice in one chunk")
        seen.add(name)
        if name not in info:
            problems.append(f"{name}: unexpected name: not in the refit metadata")
            continue
        shape, dtype = info[name]
        if tuple(tensor.shape) != _dims(shape) or tensor.dtype != dtype:
            problems.append(
                f"{name}: {tensor.dtype} {list(tensor.shape)}, the metadata announced "
                f"{dtype} {list(_dims(shape))}"
            )
    if problems:
        raise RefitMismatch(where, PAYLOAD, problems, PAYLOAD_FIX)


def load_prequantized(
    weights: Sequence[tuple[str, torch.Tensor]], model_runner: Any, *, info: RefitInfo
) -> None:
    """In place of NeMo RL's `fp8.load_weights(weights, model_runner)`: check the chunk against
    the metadata, then `model_runner.model.load_weights` with the pairs as sent."""
    weights = list(weights)
    check_chunk(weights, info)
    model_runner.model.load_weights(weights)
