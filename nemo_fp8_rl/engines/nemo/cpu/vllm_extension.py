"""The vLLM worker extensions of the real-vLLM CPU workers (`cpu.vllm_worker`).

NeMo RL's `VllmInternalWorkerExtension` (`refit.quantize_on: generator`) and the project's
`TrainerFp8WorkerExtension` (`trainer`) run in vLLM's CPU worker as shipped, with the CUDA-only
answers of `cpu.extension` (the device id NeMo RL reads from NVML, the IPC fence) and one more:
`bind_numa` pins a vLLM worker to its GPU's NUMA node from `torch.cuda.current_device()`;
there is no GPU, so nothing is bound (NeMo RL's own answer when it finds no GPU id).

Two steps more make NeMo RL's refit work on vLLM's CPU build (`cpu.vllm_cpu_weights`, with the
measurements): around each refit, the linear parameters vLLM's CPU processing replaced are given
back before anything loads, and the CPU FP8 kernel's VNNI packing, which NeMo RL's FP8 patch of
`process_weights_after_loading` skips, runs after NeMo RL's finalize; `pack_cpu_fp8` runs the
same packing once after the engine's own load.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

from nemo_fp8_rl.engines.nemo.cpu.device import device_uuid
from nemo_fp8_rl.engines.nemo.cpu.vllm_cpu_weights import pack_fp8, restore_replaced
from nemo_fp8_rl.engines.nemo.worker.generator_refit_check import GeneratorRefitCheck
from nemo_fp8_rl.engines.nemo.worker.vllm_extension import TrainerFp8WorkerExtension


class _CpuVllmDevice:
    """The device answers of vLLM's CPU worker (module docstring)."""

    def report_device_id(self) -> str:
        """The CPU worker's device id (`cpu.device.device_uuid`), in place of NVML's UUID."""
        return device_uuid()

    def bind_numa(self) -> bool:
        """No GPU to bind to: nothing bound (False, as NeMo RL answers without a GPU id)."""
        return False

    def _synchronize_before_ipc_data_ack(self) -> None:
        """Nothing to fence: CPU copies finish before the call returns."""
        return None

    def pack_cpu_fp8(self) -> int:
        """vLLM's CPU FP8 packing of what the engine loaded (NeMo RL's FP8 patch skipped it at
        load too); the worker calls it once after building the engine. How many layers."""
        return pack_fp8(self.model_runner.model)

    @contextlib.contextmanager
    def _weight_update_lifecycle(self, transport: Any) -> Iterator[Callable[[], None]]:
        """NeMo RL's setup and finalize around a refit (either transport), with vLLM's CPU
        steps around them (`vllm_cpu_weights`): the linear parameters vLLM's CPU processing
        replaced given back before anything loads, and after NeMo RL's finalize the CPU FP8
        kernel's packing its FP8 patch skips."""
        model = self.model_runner.model
        restore_replaced(model)
        with super()._weight_update_lifecycle(transport) as finalize:  # type: ignore[misc]

            def finalize_on_cpu() -> None:
                finalize()
                pack_fp8(model)

            yield finalize_on_cpu


class CpuVllmWorkerExtension(_CpuVllmDevice, GeneratorRefitCheck, VllmInternalWorkerExtension):
    """NeMo RL's extension with the generator-path metadata check, on vLLM's CPU worker."""


class CpuVllmTrainerFp8WorkerExtension(_CpuVllmDevice, TrainerFp8WorkerExtension):
    """The project's trainer-quantized FP8 extension on vLLM's CPU worker."""
