"""The cluster engine: a recipe as a NeMo RL GRPO run (Megatron-Core policy, vLLM generation).

    from nemo_fp8_rl.engines import nemo
    ok, why = nemo.available()            # supported NeMo RL importable? else what to install
    cfg = nemo.to_nemo_config(recipe)     # the hand-off: recipe minus project-owned sections
    run_dir = nemo.run(recipe, resume=False)

The project's loss (`worker.loss.NemoCalibratedLoss`) replaces NeMo RL's `ClippedPGLossFn`; on
calibration steps `driver.shadow.ShadowPolicy` runs the BF16 shadow passes through the policy's
log-prob path (`worker.policy_worker.ShadowMegatronPolicyWorker` switches FP8 compute off),
pools the statistics of all data-parallel ranks and updates the calibrator, whose state is saved
in NeMo RL's checkpoints. Supported: NeMo RL v0.7.0 and later (`driver.compat`).

The folders follow NeMo RL's process boundary: `driver/` runs in `nemo_fp8_rl.train`'s process,
`worker/` in NeMo RL's Ray workers and vLLM's processes, `cpu/` is NeMo RL's loop rehearsed on
one CPU machine, `preflight/` the launch rehearsal before a job is queued; each folder's
docstring says what crosses between them. The names above are loaded when first used, so a Ray
worker importing `worker/` loads nothing of the driver, and nothing here imports NeMo RL until
it is called.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_fp8_rl.config import Recipe
    from nemo_fp8_rl.engines.nemo.driver.compat import SUPPORTED, available, detect
    from nemo_fp8_rl.engines.nemo.driver.handoff import HandoffError, to_nemo_config

__all__ = ["SUPPORTED", "HandoffError", "available", "detect", "run", "to_nemo_config"]
_LAZY = {
    "SUPPORTED": "compat",
    "available": "compat",
    "detect": "compat",
    "HandoffError": "handoff",
    "to_nemo_config": "handoff",
}


def __getattr__(name: str) -> Any:
    """The driver's public names, imported from `driver` when first used."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.driver.{_LAZY[name]}")
    return getattr(module, name)


def run(
    recipe: Recipe,
    *,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Run `recipe` on NeMo RL; see `driver.runner.run`."""
    from nemo_fp8_rl.engines.nemo.driver.runner import run as _run

    return _run(recipe, resume=resume, progress=progress, overwrite=overwrite)
