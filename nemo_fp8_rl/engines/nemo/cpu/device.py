"""The device id a CPU worker reports where NeMo RL's workers report their GPU's UUID.

NeMo RL names the ZeroMQ socket of the colocated refit after the device both workers share:
the policy worker binds `ipc:///tmp/{report_device_id()}.sock` and the generation worker's
extension connects to the same name (`get_zmq_address` on both sides), each reporting the
NVML UUID of its CUDA device. On the CPU loop, Ray places the two workers on the same bundle
of the `RayVirtualCluster`, whose logical GPU Ray assigns to both, so the id is

    CPU-<Ray node id>-GPU<first id of ray.get_gpu_ids()>

Both CPU workers report it through `device_uuid()`: the same bundle gives the same socket,
two bundles (or two Ray clusters on one machine, whose node ids differ) never share one.
Outside a Ray worker (a worker built in the test process) the id is `CPU-local-<pid>`.
"""

from __future__ import annotations

import os

from nemo_fp8_rl.config.user_error import UserError


class DeviceIdError(UserError, RuntimeError):
    """A CPU worker runs in a Ray actor that holds no logical GPU."""


def device_uuid_for(node_id: str, gpu_id: int | str) -> str:
    """The rule: the device id of logical GPU `gpu_id` on Ray node `node_id`."""
    return f"CPU-{node_id}-GPU{gpu_id}"


def _in_ray_worker() -> bool:
    import ray

    if not ray.is_initialized():
        return False
    return ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def device_uuid() -> str:
    """This process's device id (module docstring)."""
    import ray

    if not _in_ray_worker():
        return f"CPU-local-{os.getpid()}"
    gpu_ids = ray.get_gpu_ids()
    if not gpu_ids:
        raise DeviceIdError(
            "CPU worker device id",
            "this Ray actor holds no GPU, so it shares no socket with a colocated worker",
            "start Ray with logical GPUs (num_gpus) and build "
            "NeMo RL's RayVirtualCluster with use_gpus=True",
        )
    return device_uuid_for(ray.get_runtime_context().get_node_id(), gpu_ids[0])


def zmq_address() -> str:
    """The refit socket address both sides compute (NeMo RL's `get_zmq_address` rule)."""
    return f"ipc:///tmp/{device_uuid()}.sock"
