"""NeMo RL's vLLM generation worker with the project's worker extensions.

`refit.quantize_on: generator`: `CheckedVllmGenerationWorker` (and its async twin), NeMo RL's
worker whose extension checks the refit metadata against the served model before storing it
(`vllm_extension.GeneratorCheckedWorkerExtension`), so a bad refit is refused before any weight
moves, as on the trainer path. NeMo RL's checkpoint-engine extension (NIXL refit) is left as it
is. `refit.quantize_on: trainer`: for NeMo RL's synchronous worker and for its async engine's
(`TrainerFp8VllmAsyncGenerationWorker`, `vllm_cfg.async_engine: true`). Built like NeMo RL's own ModelOpt worker
(`nemo_rl/modelopt/models/generation/vllm_quant_worker.py`): a `VllmGenerationWorkerImpl`
whose `_create_engine` names another vLLM worker extension
(`vllm_extension.TrainerFp8WorkerExtension`), and which forwards PYTHONPATH into vLLM's worker
processes so they import this package. The engine selects it for `VllmGeneration` through
`refit_workers.trainer_generation_worker` and registers it under the interpreter NeMo RL resolves for
`VllmGenerationWorker` (`worker_env`).
"""

from __future__ import annotations

from typing import Any

import ray
from nemo_rl.distributed.worker_group_utils import get_nsight_config_if_pattern_matches
from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorkerImpl
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl

EXTENSION_FQN = "nemo_fp8_rl.engines.nemo.worker.vllm_extension.TrainerFp8WorkerExtension"
CHECKED_EXTENSION_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.vllm_extension.GeneratorCheckedWorkerExtension"
)
NEMO_EXTENSION_FQN = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"


def with_extension(llm_kwargs: dict[str, Any], fqn: str = EXTENSION_FQN) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments with the project's worker extension `fqn`."""
    llm_kwargs["worker_extension_cls"] = fqn
    return llm_kwargs


class _ProjectEngine:
    """PYTHONPATH forwarded into vLLM's worker processes, so they import this package."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        forwarded = list(kwargs.get("extra_env_vars") or [])
        kwargs["extra_env_vars"] = [*forwarded, "PYTHONPATH"]
        super().__init__(*args, **kwargs)


class _TrainerFp8Engine(_ProjectEngine):
    """`refit.quantize_on: trainer`: the trainer-quantized FP8 extension named."""

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        super()._create_engine(with_extension(llm_kwargs))  # type: ignore[misc]


class _CheckedEngine(_ProjectEngine):
    """`refit.quantize_on: generator`: NeMo RL's extension with the metadata check, in place of
    NeMo RL's plain extension only (its checkpoint-engine variant is kept)."""

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        if llm_kwargs.get("worker_extension_cls") == NEMO_EXTENSION_FQN:
            llm_kwargs = with_extension(llm_kwargs, CHECKED_EXTENSION_FQN)
        super()._create_engine(llm_kwargs)  # type: ignore[misc]


@ray.remote(
    runtime_env={**get_nsight_config_if_pattern_matches("vllm_generation_worker")}
)  # pragma: no cover
class CheckedVllmGenerationWorker(_CheckedEngine, VllmGenerationWorkerImpl):
    """`VllmGenerationWorker` whose refit metadata is checked before it is stored."""


@ray.remote(
    runtime_env={**get_nsight_config_if_pattern_matches("vllm_async_generation_worker")}
)  # pragma: no cover
class CheckedVllmAsyncGenerationWorker(_CheckedEngine, VllmAsyncGenerationWorkerImpl):
    """`VllmAsyncGenerationWorker` whose refit metadata is checked before it is stored."""


@ray.remote(
    runtime_env={**get_nsight_config_if_pattern_matches("vllm_generation_worker")}
)  # pragma: no cover
class TrainerFp8VllmGenerationWorker(_TrainerFp8Engine, VllmGenerationWorkerImpl):
    """`VllmGenerationWorker` whose vLLM workers load trainer-quantized FP8 pairs as sent."""


@ray.remote(
    runtime_env={**get_nsight_config_if_pattern_matches("vllm_async_generation_worker")}
)  # pragma: no cover
class TrainerFp8VllmAsyncGenerationWorker(_TrainerFp8Engine, VllmAsyncGenerationWorkerImpl):
    """`VllmAsyncGenerationWorker` (async engine) with the same extension: its refits call the
    extension's `update_weights_from_collective` / `_via_ipc_zmq`, whose `_load_weights` is
    the project's."""
