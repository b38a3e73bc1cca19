"""The workers' GPU the GPU-specific checks assume when nothing names it, and what they cannot
decide when the recipe declares no GPU family.

A dry run on a login node (no GPU, no `--gpu`, no `slurm.gpu`, no partition) must not pass a
recipe silently because its scale-format and memory verdicts need the workers' GPU. A recipe
declares the family it runs on through its FP8 settings (`siblings.family_of`: MXFP8 is
Blackwell-only; FP32 block scales and DeepGEMM with FP32 scales are Hopper-only); the checks then
run for that family's smallest-memory member (H100, B200), the GPU on which every memory verdict
of the family is the strictest, and each verdict says it assumed it. A recipe that runs on either
family gets one line naming the checks not run and the `--gpu` values that run them.
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.gpus import GPUS, MEMORY_TYPES
from nemo_fp8_rl.guards.context import WorkerGpu
from nemo_fp8_rl.guards.siblings import FAMILY_NAMES, family_of

GPU_SPECIFIC = ("scale-format", "memory")  # the checks whose verdict depends on the workers' GPU


def assumed_worker(cfg: dict[str, Any]) -> WorkerGpu | None:
    """The smallest-memory GPU of the family the recipe declares (None: it declares none)."""
    family = family_of(cfg)
    if family is None:
        return None
    members = [g for g in GPUS if g.family == family and g.name in MEMORY_TYPES]
    gpu = min(members, key=lambda g: g.memory_mib)
    how = (
        f"assumed: the recipe is {FAMILY_NAMES[family]}-only and names no workers' GPU, so the "
        f"smallest-memory {FAMILY_NAMES[family]} GPU; --gpu names another"
    )
    return WorkerGpu(gpu, how)


def not_run_line(fp8: bool) -> str:
    """The one line a recipe that declares no GPU family gets when its workers' GPU is unknown."""
    checks = ["memory (the capacity verdict; peaks per GPU type listed)"]
    if fp8:
        checks.insert(0, "scale-format (the GPU family rules)")
    flags = ", ".join(f"--gpu {name}" for name in MEMORY_TYPES)
    return (
        f"not run for the workers' GPU (not named, and the recipe runs on Hopper and Blackwell "
        f"alike): {'; '.join(checks)}. Run them with one of {flags} (or slurm.gpu, "
        "slurm.partition)"
    )
