"""What differs between a GPU cluster and NeMo RL's loop on this CPU machine, asked of one object.

The runner drives NeMo RL the same way on both (hand-off, `grpo.setup`, the substitutions,
`grpo_train`); a `Platform` answers the few questions whose answers differ:

* `problems(config)`: what it refuses in a recipe, beyond the engine's own checks;
* `set_environment()`: process environment NeMo RL must see before it is imported;
* `handoff(config, run_dir)`: the master config NeMo RL runs (the runner writes it to the run
  directory when it differs from the hand-off);
* `start_ray(config)` / `stop_ray()`: the Ray cluster NeMo RL's workers are placed on;
* `policy_factory(calibrated, quantize_on)`: `grpo.setup(policy_factory=...)`, NeMo RL's
  `Policy` with the worker class the run needs (None: NeMo RL's own);
* `generation_workers(quantize_on)`: a context, held while `grpo.setup` runs, in which NeMo RL's
  `VllmGeneration` builds the generation worker the run needs.

`GpuCluster` is NeMo RL on GPUs, as `examples/run_grpo.py` runs it. `platform_for` picks it, or
for a CPU recipe (`cluster.gpus_per_node: 0`) the CPU rehearsal `cpu.loop.CpuLoop`: the one
place the CPU loop enters the driver.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.engines.nemo.driver.refit_workers import (
    make_policy_factory,
    policy_worker_fqn,
    trainer_generation_worker,
)


class Platform(Protocol):
    """Where a NeMo RL run is placed (module docstring)."""

    def problems(self, config: dict[str, Any]) -> list[str]: ...

    def set_environment(self) -> None: ...

    def handoff(self, config: dict[str, Any], run_dir: Path) -> dict[str, Any]: ...

    def start_ray(self, config: dict[str, Any]) -> None: ...

    def stop_ray(self) -> None: ...

    def policy_factory(self, calibrated: bool, quantize_on: str) -> Any: ...

    def generation_workers(self, quantize_on: str) -> contextlib.AbstractContextManager[Any]: ...

    def served(self) -> dict[str, Any]: ...


class GpuCluster:
    """NeMo RL on a GPU cluster: its own Ray start, the hand-off as it is, and the project's
    workers only where calibration or `refit.quantize_on: trainer` need them (`refit_workers`)."""

    def problems(self, config: dict[str, Any]) -> list[str]:
        """Nothing beyond the engine's own checks."""
        return []

    def set_environment(self) -> None:
        """Nothing: the cluster's environment is the job's."""

    def handoff(self, config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        """The hand-off as it is."""
        return config

    def start_ray(self, config: dict[str, Any]) -> None:
        """NeMo RL's `init_ray` (joins the job's Ray cluster, or starts a local one)."""
        from nemo_rl.distributed.virtual_cluster import init_ray

        init_ray()

    def stop_ray(self) -> None:
        """Nothing: the Ray cluster is the job's, and ends with it."""

    def policy_factory(self, calibrated: bool, quantize_on: str) -> Any:
        """NeMo RL's `Policy` with the project's Megatron worker where needed."""
        return make_policy_factory(
            policy_worker_fqn(calibrated=calibrated, quantize_on=quantize_on)
        )

    def generation_workers(self, quantize_on: str) -> contextlib.AbstractContextManager[Any]:
        """With `trainer`, `VllmGeneration` starts the project's vLLM worker."""
        return trainer_generation_worker(quantize_on)

    def served(self) -> dict[str, Any]:
        """NeMo RL's vLLM workers, at the vLLM version installed in the job's environment."""
        from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import served_record

        return served_record(True, "NeMo RL's vLLM worker on the GPU cluster", "gpu")


def platform_for(config: dict[str, Any], resume: bool = False) -> Platform:
    """`GpuCluster` for a GPU recipe; for a CPU recipe (`config.placement.on_cpu`), NeMo RL's loop
    on this machine (`cpu.loop.CpuLoop`), trained on the tiny kit's hand-over (`resume`: of a
    resumed run)."""
    if not on_cpu(config):
        return GpuCluster()
    from nemo_fp8_rl.engines.nemo.cpu.loop import CpuLoop

    return CpuLoop(config, resume)
