"""The vLLM worker extensions of the real-vLLM CPU workers (`cpu.vllm_worker`).

NeMo RL's `VllmInternalWorkerExtension` (`refit.quantize_on: generator`) and the project's
`TrainerFp8WorkerExtension` (`trainer`) run in vLLM's CPU worker as shipped, with the CUDA-only
answers of `cpu.extension` (the device id NeMo RL reads from NVML, the IPC fence) and one more:
`bind_numa` pins a vLLM worker to its GPU's NUMA node from `torch.cuda.current_device()`;
there is no GPU, so nothing is bound (NeMo RL's own answer when it finds no GPU id).
"""

from __future__ import annotations

from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

from nemo_fp8_rl.engines.nemo.cpu.device import device_uuid
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


class CpuVllmWorkerExtension(_CpuVllmDevice, GeneratorRefitCheck, VllmInternalWorkerExtension):
    """NeMo RL's extension with the generator-path metadata check, on vLLM's CPU worker."""


class CpuVllmTrainerFp8WorkerExtension(_CpuVllmDevice, TrainerFp8WorkerExtension):
    """The project's trainer-quantized FP8 extension on vLLM's CPU worker."""
