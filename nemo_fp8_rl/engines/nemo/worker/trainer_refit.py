"""Trainer-side FP8 refit (`refit.quantize_on: trainer`): the Megatron worker's refit stream with
every weight vLLM holds in FP8 replaced by its (E4M3, FP32 `_scale_inv`) pair, or with
`vllm_cfg.is_mx` its (E4M3, uint8 E8M0 `_scale_from_checkpoint`) pair.

NeMo RL's Megatron worker produces one stream of (HF name, tensor) pairs,
`_iter_params_with_optional_kv_scales`, and reads it three times: `prepare_refit_info` (the
`{name: (shape, dtype)}` metadata both receivers size their buffers from),
`stream_weights_via_ipc_zmq` (colocated) and `broadcast_weights_for_collective` (packed
broadcast, non-colocated). `QuantizeOnTrainer` overrides that one method:

* during `prepare_refit_info` (`planned_stream`): the BF16 export is read once for its names,
  shapes and dtypes, which fix the FP8 layout (`refit.nemo_fp8.NemoFp8Layout`: NeMo RL's
  `_is_fp8_weight` rules under `init_fp8`'s settings, which need every streamed name); the
  stream then yields shape-only tensors of what will be sent: for an FP8 weight of shape (m, n)

      name            float8_e4m3fn  (m, n)
      name_scale_inv  float32        (ceil(m/128), ceil(n/128))      block FP8
      name_scale_from_checkpoint  uint8  (m, n/32)                 MXFP8 (is_mx)

  and grouped MoE expert slabs as their per-expert pairs where NeMo RL expands them (7ea279a);
* at every refit (`quantized_stream`): the same entries with the tensors quantized by
  `refit.nemo_fp8` (bit-identical to NeMo RL's `cast_tensor_to_fp8_blockwise`, or with is_mx to
  its `quantize_mxfp8_weight`), one exported tensor at a time.

Everything else (embeddings, norms, the LM head, BF16-kept layers, FP8 KV-cache scales and
`draft.`-prefixed draft-model weights, which NeMo RL's vLLM side routes to the drafter in BF16)
passes unchanged. Imports neither NeMo RL nor vLLM at import time.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules

DRAFT_PREFIX = "draft."  # NeMo RL's prefix for trainer-owned draft-model weights
NEMO_FP8_MODULE = "nemo_rl.models.generation.vllm.quantization.fp8"
EXPANSION = "def _expand_grouped_moe_expert_to_fp8"
NESTED_RANGES = "bf16_params.append(_get_params_in_layers"
READS_IS_MX = 'vllm_cfg.get("is_mx")'


def nemo_rl_fp8_source() -> str:
    """The source of the NeMo RL in use's vLLM FP8 module ('' without NeMo RL). Read, not
    imported: importing it needs vLLM, which the Megatron worker's environment does not hold."""
    try:
        spec = importlib.util.find_spec(NEMO_FP8_MODULE)
    except ModuleNotFoundError:  # no NeMo RL at all
        return ""
    if spec is None or spec.origin is None:
        return ""
    return Path(spec.origin).read_text(encoding="utf-8")


def rules_for_worker(cfg: Mapping[str, Any], num_layers: int) -> NemoFp8Rules:
    """FP8 layout rules from a NeMo RL policy worker's config (`cfg["generation"]["vllm_cfg"]`),
    for the NeMo RL in use: 7ea279a expands grouped MoE expert slabs per expert (v0.7.0 passes
    them on in BF16), v0.7.0 hands vLLM its BF16 layer ranges as a nested list vLLM never
    matches (`bf16_params.append`, fp8.py:214), so there those keys decide nothing, and v0.7.0
    does not read `is_mx` (refused there)."""
    vllm_cfg = (cfg.get("generation") or {}).get("vllm_cfg") or {}
    source = nemo_rl_fp8_source()
    return NemoFp8Rules.from_vllm_cfg(
        vllm_cfg,
        num_layers,
        expand_grouped_experts=EXPANSION in source,
        bf16_layer_ranges_apply=NESTED_RANGES not in source,
        reads_is_mx=READS_IS_MX in source,
    )


def planned_entries(
    layout: NemoFp8Layout, name: str, shape: tuple[int, ...], dtype: torch.dtype
) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """What one exported tensor travels as, (name, shape, dtype) each; draft weights unchanged."""
    if name.startswith(DRAFT_PREFIX):
        return [(name, tuple(shape), dtype)]
    return layout.planned(name, tuple(shape), dtype)


def plan_layout(
    named: Iterable[tuple[str, torch.Tensor]], rules: NemoFp8Rules
) -> tuple[NemoFp8Layout, list[tuple[str, tuple[int, ...], torch.dtype]]]:
    """Read the BF16 stream once: the layout and every planned (name, shape, dtype) entry."""
    exported = [(n, tuple(t.shape), t.dtype) for n, t in named]  # tensors dropped one by one
    layout = NemoFp8Layout([n for n, _, _ in exported if not n.startswith(DRAFT_PREFIX)], rules)
    entries = [e for n, s, d in exported for e in planned_entries(layout, n, s, d)]
    return layout, entries


def shape_only(entries: Iterable[tuple[str, tuple[int, ...], torch.dtype]]) -> Iterator:
    """(name, tensor on the meta device): shape and dtype, no storage."""
    for name, shape, dtype in entries:
        yield name, torch.empty(shape, dtype=dtype, device="meta")


def quantized_stream(
    named: Iterable[tuple[str, torch.Tensor]], layout: NemoFp8Layout
) -> Iterator[tuple[str, torch.Tensor]]:
    """`named` with each FP8 weight replaced by its pair(s), lazily (one tensor at a time, so
    the transports' buffers bound memory as they do for NeMo RL's BF16 stream)."""
    for name, tensor in named:
        if name.startswith(DRAFT_PREFIX):
            yield name, tensor
        else:
            yield from layout.quantize_named(name, tensor)


class QuantizeOnTrainer:
    """Mixin for NeMo RL's `MegatronPolicyWorkerImpl`: the refit stream carries FP8 pairs.

    NeMo RL calls `prepare_refit_info` at setup, before any refit; it fixes the layout that
    every later refit uses. Arguments of the stream method pass through (7ea279a adds
    `conversion_tasks`).
    """

    _fp8_layout: NemoFp8Layout | None = None
    _fp8_planning: bool = False

    def prepare_refit_info(self, *args: Any, **kwargs: Any) -> Any:
        self._fp8_planning = True
        try:
            return super().prepare_refit_info(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._fp8_planning = False

    def _iter_params_with_optional_kv_scales(self, *args: Any, **kwargs: Any) -> Iterator:
        base = super()._iter_params_with_optional_kv_scales(*args, **kwargs)  # type: ignore[misc]
        if self._fp8_planning:
            num_layers = self.megatron_bridge.transformer_config.num_layers  # type: ignore[attr-defined]
            layout, entries = plan_layout(base, rules_for_worker(self.cfg, num_layers))  # type: ignore[attr-defined]
            self._fp8_layout = layout
            return shape_only(entries)
        if self._fp8_layout is None:
            raise RuntimeError(
                "refit.quantize_on: trainer: the FP8 refit stream was read before "
                "prepare_refit_info fixed its layout (NeMo RL calls it in grpo.setup)"
            )
        return quantized_stream(base, self._fp8_layout)
