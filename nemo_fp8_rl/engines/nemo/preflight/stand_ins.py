"""What the preflight stands in, as data: the driver's replacements and the workers' answers.

`DRIVER` is the list of module attributes replaced while NeMo RL's driver code runs
(`driver_replacements` installs exactly these); `worker_rehearsal.STOOD_IN` and
`megatron_checks.STOOD_IN` are the workers' and Megatron's; `NOT_RUN` is what does not run at all.
docs/cluster.md shows `markdown()`, printed by `python -m nemo_fp8_rl.engines.nemo.preflight.stand_ins`
(a test holds the doc to it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight import megatron_checks, worker_rehearsal
from nemo_fp8_rl.engines.nemo.preflight import recorders as rec
from nemo_fp8_rl.engines.nemo.preflight.recorders import StandIn

DATASETS = "nemo_rl.data.datasets.*.load_dataset"
DRIVER: tuple[StandIn, ...] = (
    StandIn(
        "nemo_rl.algorithms.grpo.RayVirtualCluster",
        "ClusterRecorder",
        "Ray placement groups of GPUs",
    ),
    StandIn(
        "nemo_rl.models.policy.lm_policy.RayWorkerGroup",
        "WorkerGroupRecorder",
        "starts the Megatron worker actors",
    ),
    StandIn(
        "nemo_rl.models.policy.lm_policy.RayQueue",
        "QueueRecorder",
        "a Ray actor (the workers' start-up queue)",
    ),
    StandIn("nemo_rl.models.policy.lm_policy.ray", "RayRecorder", "`ray.get` on worker futures"),
    StandIn(
        "nemo_rl.models.generation.vllm.vllm_generation.RayWorkerGroup",
        "WorkerGroupRecorder",
        "starts the vLLM worker actors",
    ),
    StandIn(
        "nemo_rl.models.generation.vllm.vllm_generation.ray",
        "RayRecorder",
        "`ray.get`, placement-group tables",
    ),
    StandIn("nemo_rl.algorithms.grpo.ray", "RayRecorder", "`ray.get` on actor futures"),
    StandIn(
        "nemo_rl.algorithms.grpo.grpo_train", "TrainRecorder", "the training loop itself (GPU work)"
    ),
    StandIn(
        "nemo_rl.algorithms.grpo.async_grpo_train",
        "TrainRecorder.async_grpo_train",
        "the asynchronous training loop (replay-buffer and trajectory-collector actors, GPU work); "
        "its arguments are bound to the real function's signature",
    ),
    StandIn(
        "nemo_rl.distributed.virtual_cluster.init_ray",
        "RayRecorder.init",
        "connects to / starts a Ray cluster",
    ),
    StandIn(
        "nemo_rl.utils.logger.RayGpuMonitorLogger", "GpuMonitorRecorder", "a Ray actor polling GPUs"
    ),
    StandIn(
        "nemo_rl.data.utils.create_env",
        "EnvironmentRecorder",
        "starts the reward environment actor (its name is checked against NeMo RL's `ENV_REGISTRY`)",
    ),
    StandIn(
        "nemo_rl.utils.venvs.create_local_venv_on_each_node",
        "VenvRecorder",
        "builds a worker venv on every Ray node",
    ),
    StandIn(
        DATASETS,
        "HubDatasetRecorder",
        "downloads from the Hub (a few rows with the real columns instead)",
    ),
)
ENVIRONMENT: tuple[StandIn, ...] = (
    StandIn(
        "os.environ['TORCH_CUDA_ARCH_LIST']",
        "'9.0' when unset",
        "NeMo RL's container sets it; `Policy` refuses a Megatron run without it",
    ),
)
NOT_RUN: tuple[StandIn, ...] = (
    StandIn(
        "Megatron worker (MegatronPolicyWorker)",
        "not started",
        "builds the model from the checkpoint, initialises torch.distributed and the optimizer on GPUs",
    ),
    StandIn(
        "vLLM engine (vllm.LLM)",
        "LLMRecorder",
        "loads the model, profiles GPU memory, sizes the KV cache; its configuration checks run instead (vLLM's own where installed)",
    ),
    StandIn("the training loop (grpo_train, async_grpo_train)", "TrainRecorder", "GPU work"),
)


@contextlib.contextmanager
def cuda_arch_list() -> Iterator[None]:
    """`ENVIRONMENT`: TORCH_CUDA_ARCH_LIST set to '9.0' inside the block when it is unset."""
    unset = "TORCH_CUDA_ARCH_LIST" not in os.environ
    if unset:
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    try:
        yield
    finally:
        if unset:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)


def keep(cls: type, bucket: list) -> type:
    """A subclass of `cls` that appends each instance to `bucket` after `cls.__init__` ran."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        bucket.append(self)

    return type(cls.__name__, (cls,), {"__init__": __init__})


def _split(target: str) -> tuple[Any, str]:
    module, attr = target.rsplit(".", 1)
    return importlib.import_module(module), attr


def driver_replacements(
    values: dict[str, Any], dataset_recorder: Any
) -> list[tuple[Any, str, Any]]:
    """(module, attribute, value) for every row of `DRIVER`; `values` maps recorder name to value."""
    out = []
    for row in DRIVER:
        if row.target == DATASETS:
            out += [(m, "load_dataset", dataset_recorder) for m in rec.dataset_modules()]
        else:
            out.append((*_split(row.target), values[row.recorder]))
    return out


def all_rows() -> dict[str, tuple[StandIn, ...]]:
    """Every stand-in, by where it acts."""
    return {
        "NeMo RL's driver (grpo.setup, Policy, VllmGeneration)": DRIVER,
        "process environment": ENVIRONMENT,
        "the vLLM worker's configuration path": worker_rehearsal.STOOD_IN,
        "the Megatron checks": megatron_checks.STOOD_IN,
        "not run at all": NOT_RUN,
    }


def markdown() -> str:
    """The stand-in tables as Markdown (one table per place)."""
    lines = []
    for place, rows in all_rows().items():
        lines += [f"Stood in, {place}:", "", "| replaced | by | why |", "|---|---|---|"]
        lines += [f"| `{r.target}` | {r.recorder} | {r.why} |" for r in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
