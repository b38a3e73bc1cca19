"""The cluster engine: a recipe as a NeMo RL GRPO run (Megatron-Core policy, vLLM generation).

    from nemo_fp8_rl.engines import nemo
    ok, why = nemo.available()            # supported NeMo RL importable? else what to install
    cfg = nemo.to_nemo_config(recipe)     # the hand-off: recipe minus project-owned sections
    run_dir = nemo.run(recipe, resume=False)

The project's loss (`loss.NemoCalibratedLoss`) replaces NeMo RL's `ClippedPGLossFn`; on
calibration steps `shadow.ShadowPolicy` runs the BF16 shadow passes through the policy's
log-prob path (`worker.ShadowMegatronPolicyWorker` switches FP8 compute off), pools the
statistics of all data-parallel ranks and updates the calibrator, whose state is saved in
NeMo RL's checkpoints. Supported: NeMo RL v0.7.0 and later (`compat`). Nothing here imports
NeMo RL until it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nemo_fp8_rl.engines.nemo.driver.compat import SUPPORTED, available, detect
from nemo_fp8_rl.engines.nemo.driver.handoff import HandoffError, to_nemo_config

if TYPE_CHECKING:
    from nemo_fp8_rl.config import Recipe

__all__ = ["SUPPORTED", "HandoffError", "available", "detect", "run", "to_nemo_config"]


def run(
    recipe: Recipe,
    *,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    cpu_inputs: Callable[[Path], dict[str, str]] | None = None,
) -> Path:
    """Run `recipe` on NeMo RL; see `runner.run`."""
    from nemo_fp8_rl.engines.nemo.driver.runner import run as _run

    return _run(
        recipe, resume=resume, progress=progress, overwrite=overwrite, cpu_inputs=cpu_inputs
    )
