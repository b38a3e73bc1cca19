"""Ray plumbing: place the trainer and rollout engine as actors (Ray itself is started by
`nemo_fp8_rl.runs.ray_start`)."""

from __future__ import annotations

from typing import Any

import ray

from nemo_fp8_rl.engines.local.rollout import Rollout
from nemo_fp8_rl.engines.local.trainer import Trainer


def make_actors(config: dict[str, Any], model_dir: str | None, num_threads: int) -> tuple[Any, Any]:
    """The trainer and rollout actors (one CPU each). Creation returns at once; with
    `model_dir=None` they build the model from the recipe while the caller prepares the
    warm-started policy (then `trainer.load_policy`), so their start-up overlaps the warm-up."""
    trainer_cls = ray.remote(num_cpus=1)(Trainer)
    rollout_cls = ray.remote(num_cpus=1)(Rollout)
    trainer = trainer_cls.remote(config, model_dir, num_threads)
    rollout = rollout_cls.remote(config, model_dir, num_threads)
    return trainer, rollout
