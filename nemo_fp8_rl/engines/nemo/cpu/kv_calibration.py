"""`calibrate_qkv_fp8_scales` of the CPU policy worker: FP8 KV-cache scales, as NeMo RL's
Megatron worker computes them (`grpo_train` calls it when `vllm_cfg.kv_cache_dtype` is FP8).

A forward pre-hook on every `self_attention.core_attention` module (not its softmax) records
amax(|q|), amax(|k|), amax(|v|) per microbatch during one `get_logprobs` pass; per layer the `percentile` of those
samples (nearest rank), max over ranks, times `margin`, divided by the FP8 maximum (448, or
`FP8_MAX_Q`/`_K`/`_V` from the environment) is the scale. The result has NeMo RL's shape:
`{"format": "fp8", "percentile", "margin", "layers": {vLLM scale name: value}}`, the names
from NeMo RL's `convert_calibration_to_vllm_format`.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Any

import torch

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")


def _fp8_max(kind: str) -> float:
    value = os.environ.get(f"FP8_MAX_{kind}", "")
    return float(value) if value else 448.0


def _nearest_rank(values: list[float], percentile: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = round(percentile / 100.0 * (len(ordered) - 1))
    return ordered[max(0, min(len(ordered) - 1, rank))]


def _hooks(model: torch.nn.Module, samples: dict, include_q: bool) -> list:
    handles = []
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if not name.endswith("self_attention.core_attention") or match is None:
            continue
        layer = f"layer_{match.group(1)}"

        def pre_hook(_module: Any, args: tuple, layer: str = layer) -> None:
            q, k, v = args[0], args[1], args[2]
            for kind, t in (("q", q), ("k", k), ("v", v)):
                if kind != "q" or include_q:
                    samples[layer][kind].append(float(t.detach().abs().amax()))

        handles.append(module.register_forward_pre_hook(pre_hook))
    return handles


def calibrate(
    worker: Any,
    data: Any,
    micro_batch_size: int | None,
    percentile: float,
    margin: float,
    include_q: bool,
) -> dict[str, Any]:
    """The scales for `data` (see the module docstring)."""
    from nemo_rl.models.generation.vllm.quantization.fp8_train_utils import (
        convert_calibration_to_vllm_format,
    )

    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    handles = _hooks(worker.model, samples, include_q)
    try:
        worker.get_logprobs(data=data, micro_batch_size=micro_batch_size)
    finally:
        for h in handles:
            h.remove()
    kinds = ("q", "k", "v") if include_q else ("k", "v")
    amax = {
        layer: torch.tensor([_nearest_rank(per[k], percentile) for k in kinds])
        for layer, per in sorted(samples.items())
    }
    for t in amax.values():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    layers = {
        layer: {
            f"{k}_scale": float(a * margin / _fp8_max(k.upper()))
            for k, a in zip(kinds, t.tolist(), strict=True)
        }
        for layer, t in amax.items()
    }
    return {
        "format": "fp8",
        "percentile": percentile,
        "margin": margin,
        "layers": convert_calibration_to_vllm_format(layers),
    }
