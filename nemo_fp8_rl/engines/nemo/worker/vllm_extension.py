"""NeMo RL's vLLM worker extensions of the project (run in vLLM's workers).

`GeneratorCheckedWorkerExtension` (`refit.quantize_on: generator`): NeMo RL's extension with the
refit metadata checked against the served model before it is stored (`generator_refit_check`).
`TrainerFp8WorkerExtension` (`refit.quantize_on: trainer`), described below. vLLM mixes `worker_extension_cls` into each of its workers;
`generation_worker.TrainerFp8VllmGenerationWorker` names this class there, as NeMo RL's own
ModelOpt worker names its extension (`nemo_rl/modelopt/models/generation/vllm_quant_worker.py`).
Two methods differ from NeMo RL's `VllmInternalWorkerExtension`:

* `prepare_refit_info` checks the whole metadata against the model (`check_refit_info`, with
  NeMo RL's own `_is_fp8_weight` deciding what vLLM holds in FP8, and its `global_fp8_config
  .is_mx` whether the pairs are block FP8 or MXFP8) before storing it; a mismatch raises there,
  during setup, before any refit.
* `_load_weights` runs NeMo RL's loading path (Gemma-3 names, draft split, the FP8 branch) with
  its FP8 step, `fp8.load_weights` (quantize, then `model.load_weights`), replaced for the call
  by `load_prequantized` (check the chunk, then `model.load_weights` with the pairs as sent).
  NeMo RL looks `fp8.load_weights` up at call time (vllm_backend.py `_load_weights` in v0.7.0,
  `_load_hf_weights` in 7ea279a), so the replacement covers both snapshots without copying
  their loading code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from nemo_rl.models.generation.vllm.quantization import fp8
from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

from nemo_fp8_rl.engines.nemo.worker.generator_refit_check import GeneratorRefitCheck
from nemo_fp8_rl.engines.nemo.worker.vllm_refit import (
    GROUPED_SLABS,
    PAYLOAD,
    PAYLOAD_FIX,
    RefitInfo,
    check_refit_info,
    load_prequantized,
)
from nemo_fp8_rl.refit.errors import RefitMismatch


def holds_fp8(model: Any, name: str) -> bool:
    """Whether vLLM's `model` holds `name` in FP8: NeMo RL's `_is_fp8_weight`; for a grouped
    expert slab (no `.weight` suffix), whether NeMo RL expands it into per-expert FP8 pairs
    (7ea279a's `fp8.load_weights` does where the layer's experts are FP8; v0.7.0 never does)."""
    if name.endswith(GROUPED_SLABS):
        if not hasattr(fp8, "_expand_grouped_moe_expert_to_fp8"):
            return False
        experts = fp8._get_module_from_param_name(model, name)
        w13, w2 = getattr(experts, "w13_weight", None), getattr(experts, "w2_weight", None)
        return all(w is not None and w.dtype == torch.float8_e4m3fn for w in (w13, w2))
    return bool(fp8._is_fp8_weight(name, model))


@contextlib.contextmanager
def prequantized_loader(info: RefitInfo) -> Iterator[None]:
    """NeMo RL's `fp8.load_weights` replaced by `load_prequantized` (checked against `info`)."""
    original = fp8.load_weights
    fp8.load_weights = partial(load_prequantized, info=info)
    try:
        yield
    finally:
        fp8.load_weights = original


class TrainerFp8WorkerExtension(VllmInternalWorkerExtension):
    """`VllmInternalWorkerExtension` that loads trainer-quantized FP8 pairs as they are."""

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Check the whole refit metadata against the model, then store it as NeMo RL does."""
        runner = self.model_runner
        if not fp8.is_fp8_model(runner.vllm_config):
            raise RefitMismatch(
                "prepare_refit_info",
                PAYLOAD,
                [
                    "vLLM runs without FP8 weights (no block-FP8 or MXFP8 quant_config), so FP8 "
                    "pairs have "
                    "nowhere to go; refit.quantize_on: trainer needs vllm_cfg.precision: fp8"
                ],
                PAYLOAD_FIX,
            )
        mx = bool(getattr(fp8.global_fp8_config, "is_mx", False))
        check_refit_info(state_dict_info, partial(holds_fp8, runner.model), mx=mx)
        super().prepare_refit_info(state_dict_info)

    def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """NeMo RL's loading path with the FP8 step loading the pairs as sent."""
        with prequantized_loader(self.state_dict_info):
            super()._load_weights(weights)


class GeneratorCheckedWorkerExtension(GeneratorRefitCheck, VllmInternalWorkerExtension):
    """NeMo RL's extension (`refit.quantize_on: generator`) whose `prepare_refit_info` checks
    the metadata against the served model first (`generator_refit_check`); nothing else differs."""
