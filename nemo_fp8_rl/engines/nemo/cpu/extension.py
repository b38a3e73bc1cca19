"""NeMo RL's vLLM worker extensions with the two CUDA-only calls of their refit answered on CPU.

The CPU generation worker receives refits through NeMo RL's own
`VllmInternalWorkerExtension` (`refit.quantize_on: generator`) or the project's
`TrainerFp8WorkerExtension` (`trainer`): `prepare_refit_info`, `update_weights_via_ipc_zmq`
(ZeroMQ REP socket, manifest checks, buffer rebuild, `_load_weights`, the FP8 step, the
finalize step), `cleanup` run as shipped. Two methods differ:

* `report_device_id`: NVML's CUDA device UUID there, the CPU worker's device id here
  (`cpu.device`), so `get_zmq_address` names the socket the colocated policy worker binds;
* `_synchronize_before_ipc_data_ack`: a CUDA stream fence there; CPU copies are synchronous.

Importing this module imports NeMo RL's vLLM modules: install `vllm_names` first.
"""

from __future__ import annotations

from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

from nemo_fp8_rl.engines.nemo.worker.vllm_extension import TrainerFp8WorkerExtension


class _CpuDevice:
    """The device answers of a CPU worker (module docstring)."""

    device_uuid: str

    def report_device_id(self) -> str:
        """The CPU worker's device id (`cpu.device.device_uuid`)."""
        return self.device_uuid

    def _synchronize_before_ipc_data_ack(self) -> None:
        """Nothing to fence: the CPU worker's copies finish before the call returns."""
        return None


class CpuWorkerExtension(_CpuDevice, VllmInternalWorkerExtension):
    """NeMo RL's extension (`refit.quantize_on: generator`) on the CPU worker."""


class CpuTrainerFp8WorkerExtension(_CpuDevice, TrainerFp8WorkerExtension):
    """The project's trainer-quantized FP8 extension (`refit.quantize_on: trainer`) on CPU."""
