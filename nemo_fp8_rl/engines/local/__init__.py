"""The embedded default engine: tiny Qwen3/Llama on CPU, emulated FP8, Ray actors.

`run(recipe, *, resume=False, progress=True, overwrite=False) -> Path` runs a recipe with
`cluster.gpus_per_node: 0` (see `nemo_fp8_rl.engines.local.runner`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nemo_fp8_rl.config import Recipe


def run(
    recipe: Recipe, *, resume: bool = False, progress: bool = True, overwrite: bool = False
) -> Path:
    """Run `recipe` on this machine's CPUs; returns the run directory (imports Ray lazily)."""
    # Under `uv run`, Ray would package the working directory and build a second environment
    # for its workers; they use this interpreter's environment instead (NeMo RL sets the same).
    # Ray reads the switch when it is imported, so it is set before the runner imports Ray.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    resume, done = check_run_dir(recipe, resume=resume, overwrite=overwrite)
    if done is not None:
        print(done, flush=True)
        return Path(recipe.run_dir).resolve()
    from nemo_fp8_rl.engines.local.runner import run as _run

    return _run(recipe, resume=resume, progress=progress, overwrite=overwrite)


def check_run_dir(recipe: Recipe, *, resume: bool, overwrite: bool) -> tuple[bool, str | None]:
    """The run dir and (on resume) the checkpoint checks, before Ray, torch or transformers are
    imported: a refused run fails in a second and writes nothing.

    Returns (resume, finished): `resume` is False when --resume names a run that never completed
    a step (it starts from the beginning, as a plain rerun would); `finished` is the line to
    print instead of training when --resume names a run that already completed all its steps.
    """
    from nemo_fp8_rl.engines.local.backends import check_available
    from nemo_fp8_rl.engines.local.checkpoint import resume_point
    from nemo_fp8_rl.runs import lock, rundir
    from nemo_fp8_rl.runs.ray_start import probe_address

    run_dir = Path(recipe.run_dir).resolve()
    rundir.check_owner(run_dir, recipe.config, resume=resume, overwrite=overwrite)
    lock.check_free(run_dir)
    check_available(recipe.config)
    if os.environ.get("RAY_ADDRESS", "").strip():
        probe_address(os.environ["RAY_ADDRESS"].strip())
    if not resume:
        return False, None
    if not rundir.run_progress(run_dir, recipe.config).started:
        print(f"{run_dir}: the run never completed a step; starting it from the beginning")
        return False, None
    steps = recipe.config["grpo"]["max_num_steps"]
    point = resume_point(run_dir / "checkpoints", recipe.name, steps)
    if point.name == f"step_{steps}":
        return True, (
            f"{run_dir}: the run already completed all {steps} steps ({point.name}); nothing to "
            f"train. To train longer: --resume grpo.max_num_steps=<more than {steps}>"
        )
    return True, None


__all__ = ["check_run_dir", "run"]
