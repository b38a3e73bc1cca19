"""Ray plumbing: start or join a cluster, and place the trainer and rollout engine as actors."""

from __future__ import annotations

import os
from typing import Any

import ray

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.local.rollout import Rollout
from nemo_fp8_rl.engines.local.trainer import Trainer


def start_ray(num_cpus: int = 2) -> bool:
    """Connect to `RAY_ADDRESS` when set (e.g. inside a Slurm job), else start a local Ray.

    Returns True when this call started Ray (so the caller shuts it down at the end). A Ray
    that does not start (an overloaded machine, a full /tmp, a dead `RAY_ADDRESS`) is a runtime
    fault reported as a `UserError`, not an internal error.
    """
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, log_to_driver=True)
            return False
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    except Exception as exc:  # noqa: BLE001 (Ray raises plain Exceptions on start-up failures)
        raise UserError(
            f"Ray ({'RAY_ADDRESS=' + address if address else 'local cluster'})",
            f"could not start or join Ray: {exc}",
            "retry when the machine is less loaded, check free space in /tmp (Ray's session "
            "folder), and that RAY_ADDRESS, if set, names a running cluster; then --resume",
        ) from exc
    return True


def make_actors(config: dict[str, Any], model_dir: str | None, num_threads: int) -> tuple[Any, Any]:
    """The trainer and rollout actors (one CPU each). Creation returns at once; with
    `model_dir=None` they build the model from the recipe while the caller prepares the
    warm-started policy (then `trainer.load_policy`), so their start-up overlaps the warm-up."""
    trainer_cls = ray.remote(num_cpus=1)(Trainer)
    rollout_cls = ray.remote(num_cpus=1)(Rollout)
    trainer = trainer_cls.remote(config, model_dir, num_threads)
    rollout = rollout_cls.remote(config, model_dir, num_threads)
    return trainer, rollout
