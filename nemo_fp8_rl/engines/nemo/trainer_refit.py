"""Trainer-side FP8 refit (`refit.quantize_on: trainer`): the Megatron worker's refit stream with
every weight vLLM holds in FP8 replaced by its (E4M3, FP32 `_scale_inv`) pair.

NeMo RL's Megatron worker produces one stream of (HF name, tensor) pairs,
`_iter_params_with_optional_kv_scales`, and uses it three times: `prepare_refit_info` (the
`{name: (shape, dtype)}` metadata both receivers size their buffers from),
`stream_weights_via_ipc_zmq` (colocated) and `broadcast_weights_for_collective` (packed
broadcast, non-colocated). `QuantizeOnTrainer` overrides that one method, so the metadata
describes exactly what the two transports then send: for an FP8 weight W of shape (m, n),

    name            float8_e4m3fn  (m, n)
    name_scale_inv  float32        (ceil(m/128), ceil(n/128))

quantized by `nemo_fp8_rl.refit.nemo_fp8` (NeMo RL's `cast_tensor_to_fp8_blockwise`
bit for bit, grouped MoE expert slabs expanded per expert as NeMo RL's vLLM side does).
Everything else (embeddings, norms, the LM head, BF16-kept layers, FP8 KV-cache scales and
`draft.`-prefixed draft-model weights, which NeMo RL's vLLM side routes to the drafter in BF16)
passes unchanged. Which weights vLLM holds in FP8 follows NeMo RL's `init_fp8` settings in
`policy.generation.vllm_cfg` (`num_first_layers_in_bf16`, `num_last_layers_in_bf16`,
`quantization_ignored_layer_kws`); the vLLM side checks the metadata against its model before
the first refit (`vllm_refit.check_refit_info`).

Imports neither NeMo RL nor vLLM (the mixin's base class is supplied by `worker`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

DRAFT_PREFIX = "draft."  # NeMo RL's prefix for trainer-owned draft-model weights


@dataclass(frozen=True)
class QuantizeSettings:
    """What decides the FP8 set and its scales, read from NeMo RL's `vllm_cfg`."""

    num_layers: int
    num_first_layers_in_bf16: int = 0
    num_last_layers_in_bf16: int = 0
    ignored_layer_kws: tuple[str, ...] = ()
    pow2_scale: bool = False

    @classmethod
    def from_vllm_cfg(cls, vllm_cfg: Mapping[str, Any], num_layers: int) -> QuantizeSettings:
        """Settings as NeMo RL's `init_fp8` reads them (same keys, same defaults)."""
        return cls(
            num_layers=int(num_layers),
            num_first_layers_in_bf16=int(vllm_cfg.get("num_first_layers_in_bf16", 0) or 0),
            num_last_layers_in_bf16=int(vllm_cfg.get("num_last_layers_in_bf16", 0) or 0),
            ignored_layer_kws=tuple(vllm_cfg.get("quantization_ignored_layer_kws", []) or ()),
            pow2_scale=bool(vllm_cfg.get("pow2_weight_scaling_factors", False)),
        )


def quantize_entry(
    name: str, tensor: torch.Tensor, settings: QuantizeSettings
) -> list[tuple[str, torch.Tensor]]:
    """The refit entries for one exported tensor: its FP8 pair(s) or the tensor unchanged."""
    from nemo_fp8_rl.refit import nemo_fp8

    return nemo_fp8.quantize_named(
        name,
        tensor,
        num_layers=settings.num_layers,
        num_first_layers_in_bf16=settings.num_first_layers_in_bf16,
        num_last_layers_in_bf16=settings.num_last_layers_in_bf16,
        ignored_layer_kws=settings.ignored_layer_kws,
        pow2_scale=settings.pow2_scale,
    )


def quantized_stream(
    named: Iterable[tuple[str, torch.Tensor]], settings: QuantizeSettings
) -> Iterator[tuple[str, torch.Tensor]]:
    """`named` with each FP8 weight replaced by (name, E4M3), (name_scale_inv, FP32).

    Lazy: one exported tensor is quantized at a time, so the transports' buffers bound memory
    as they do for NeMo RL's BF16 stream.
    """
    for name, tensor in named:
        if name.startswith(DRAFT_PREFIX):
            yield name, tensor
            continue
        yield from quantize_entry(name, tensor, settings)


def refit_info(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[Any, torch.dtype]]:
    """`{name: (shape, dtype)}` of a stream, as NeMo RL's `prepare_refit_info` collects it."""
    return {name: (tensor.shape, tensor.dtype) for name, tensor in named}


def settings_for_worker(cfg: Mapping[str, Any], num_layers: int) -> QuantizeSettings:
    """Settings from a NeMo RL policy worker's config (`cfg["generation"]["vllm_cfg"]`)."""
    generation = cfg.get("generation") or {}
    return QuantizeSettings.from_vllm_cfg(generation.get("vllm_cfg") or {}, num_layers)


class QuantizeOnTrainer:
    """Mixin for NeMo RL's `MegatronPolicyWorkerImpl`: the refit stream carries FP8 pairs.

    Overrides the one stream NeMo RL's metadata step and both transports read, passing every
    argument through (7ea279a adds `conversion_tasks`).
    """

    def _iter_params_with_optional_kv_scales(
        self, *args: Any, **kwargs: Any
    ) -> Iterator[tuple[str, torch.Tensor]]:
        base = super()._iter_params_with_optional_kv_scales(*args, **kwargs)  # type: ignore[misc]
        num_layers = self.megatron_bridge.transformer_config.num_layers  # type: ignore[attr-defined]
        return quantized_stream(base, settings_for_worker(self.cfg, num_layers))  # type: ignore[attr-defined]
