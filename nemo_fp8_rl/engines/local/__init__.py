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
    from nemo_fp8_rl.engines.local.runner import run as _run

    return _run(recipe, resume=resume, progress=progress, overwrite=overwrite)


__all__ = ["run"]
