"""Ray for NeMo RL's loop on one CPU machine: logical GPUs, one interpreter, the CPU workers known.

NeMo RL's `grpo.setup` builds `RayVirtualCluster(use_gpus=True)`, whose placement-group bundles
ask for `GPU: 1` each. Ray schedules on declared resources, so a local Ray started with
`num_gpus=N` places those bundles on a CPU machine exactly as on a GPU node (the actors see
no CUDA device; the CPU workers never ask for one). This replaces NeMo RL's `init_ray`, which
starts Ray without declaring GPUs. Also set, each for a reason NeMo RL states:

* `NEMO_RL_PY_EXECUTABLES_SYSTEM=1`: NeMo RL's own switch to run every actor in this
  interpreter (its default builds per-worker `uv` environments from its own checkout);
* `TORCH_CUDA_ARCH_LIST`: `Policy` refuses the Megatron backend without it (a container
  variable); the CPU workers never compile a kernel, so its value is not used;
* the CPU workers' class paths in NeMo RL's actor-environment registry, as its error asks.
"""

from __future__ import annotations

import os
from typing import Any

LOGICAL_CPUS = 16  # Ray CPU slots: NeMo RL's actors (policy, generation, math workers) all fit
ENV_DEFAULTS = {
    "NEMO_RL_PY_EXECUTABLES_SYSTEM": "1",
    "TORCH_CUDA_ARCH_LIST": "9.0",
    "RAY_worker_niceness": "0",
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
}


def set_environment() -> None:
    """The variables above (a value the user set is kept); call before importing NeMo RL."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def register_workers(fqns: list[str]) -> None:
    """Every CPU worker runs in this interpreter (NeMo RL's `PY_EXECUTABLES.SYSTEM`)."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    for fqn in fqns:
        ACTOR_ENVIRONMENT_REGISTRY[fqn] = PY_EXECUTABLES.SYSTEM


def start_ray(num_gpus: int) -> dict[str, Any]:
    """A local Ray with `num_gpus` logical GPUs, passing this environment to every actor
    (`runs.ray_start`: retried, patient under load); returns its resources."""
    import ray

    from nemo_fp8_rl.runs.ray_start import start_ray as start

    env = {k: v for k, v in os.environ.items() if _passes(k)}
    start(LOGICAL_CPUS, num_gpus=num_gpus, runtime_env={"env_vars": env})
    # NeMo RL's memory tracker asks Ray for a memory summary without an address, which fails
    # ("Found multiple active Ray instances") when another Ray runs on this machine.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return dict(ray.cluster_resources())


def _passes(key: str) -> bool:
    """Environment passed to actors: everything but Ray's own per-process variables."""
    return not key.startswith(("RAY_ADDRESS", "RAY_RAYLET", "RAY_NODE"))
