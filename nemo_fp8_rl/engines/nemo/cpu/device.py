"""The CPU workers' stand-in for a CUDA device UUID: the key of NeMo RL's ZeroMQ refit socket.

NeMo RL's policy worker binds and its vLLM worker extension connects to
`ipc:///tmp/{report_device_id()}.sock`, where both report the NVML UUID of their CUDA device;
colocated workers on one GPU therefore meet on one socket. On the CPU the "device" is the
logical GPU Ray assigned to the actor's placement-group bundle, and the id is

    cpu-<first 16 hex digits of the Ray node id>-gpu<first id of ray.get_gpu_ids()>

The same on every actor sharing a bundle (colocated policy and generation workers), different
across logical GPUs and across Ray clusters (two runs on one machine never share a socket).
Outside a Ray actor (a worker built in-process) it is `cpu-pid<process id>-gpu0`.
"""

from __future__ import annotations

import os


def device_id() -> str:
    """This process's device id (module docstring); stable for the life of the process."""
    import ray

    if ray.is_initialized():
        try:
            gpu_ids = ray.get_gpu_ids()
            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - not inside a worker: the local id below
            gpu_ids, node = [], ""
        if gpu_ids and node:
            return f"cpu-{node[:16]}-gpu{int(float(gpu_ids[0]))}"
    return f"cpu-pid{os.getpid()}-gpu0"


def zmq_address() -> str:
    """The refit socket address both sides compute (NeMo RL's `get_zmq_address` rule)."""
    return f"ipc:///tmp/{device_id()}.sock"
