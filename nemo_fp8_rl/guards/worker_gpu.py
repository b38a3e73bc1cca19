"""The GPU type of a recipe's workers: `--gpu`, else `slurm.gpu`, else the Slurm partition's.

Never the GPU of the machine this runs on: a login node or a Ray head may have no GPU or another
one, and a GPU-less head node exporting Hopper scale settings to Blackwell workers is one of the
failures the scale-format check exists for (SkyRL, review of PR #1898).

The partition's GPU comes from `sinfo -h -p <partition> -o "%G|%f"`: each node line gives its
GRES (`gpu:h100:8`, `gpu:gb200:4(S:0-1)`) and features (`h100,ib`); a GPU type named in either
counts. A partition with nodes of two GPU types is ambiguous and named as such.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from nemo_fp8_rl.config.gpus import GpuType, find_gpu, gpu_in_words, unknown_gpu_fix
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.guards.context import WorkerGpu

Sinfo = Callable[[str], str | None]  # partition -> sinfo's output (None: sinfo not usable)


def parse_sinfo(text: str) -> set[str]:
    """GPU type names (canonical) named by `sinfo -o "%G|%f"` lines: GRES types, then features."""
    found: set[str] = set()
    for line in text.splitlines():
        gres, _, features = line.partition("|")
        names = re.findall(r"gpu:([A-Za-z][\w.-]*?):\d", gres)
        names += [f.strip() for f in features.split(",")]
        for name in names:
            gpu = gpu_in_words(name) if name and name != "(null)" else None
            if gpu is not None:
                found.add(gpu.name)
    return found


def run_sinfo(partition: str) -> str | None:
    """`sinfo -h -p P -o "%G|%f"` (None when sinfo is missing or fails)."""
    if shutil.which("sinfo") is None:
        return None
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-p", partition, "-o", "%G|%f"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def resolve_worker_gpu(
    config: dict[str, Any], flag: str | None = None, sinfo: Sinfo = run_sinfo
) -> WorkerGpu | None:
    """The workers' GPU type (module docstring); None when nothing names it."""
    if flag:
        return WorkerGpu(_known(flag, "--gpu"), "--gpu")
    slurm = config.get("slurm") or {}
    if slurm.get("gpu"):
        return WorkerGpu(_known(slurm["gpu"], "slurm.gpu"), "slurm.gpu")
    partition = slurm.get("partition")
    if not partition:
        return None
    text = sinfo(str(partition))
    found = parse_sinfo(text) if text else set()
    if len(found) > 1:
        raise UsageError(
            f"slurm.partition={partition}",
            f"the partition's nodes have several GPU types ({', '.join(sorted(found))}), so "
            "the FP8 settings cannot be decided for them",
            "name the workers' type with --gpu TYPE (or slurm.gpu), and pick nodes of that type "
            "(slurm.extra_sbatch_args: ['--constraint=...'])",
        )
    if not found:
        return None
    return WorkerGpu(find_gpu(found.pop()), f"sinfo -p {partition}")  # type: ignore[arg-type]


def _known(name: str, where: str) -> GpuType:
    gpu = find_gpu(name)
    if gpu is None:
        raise UsageError(where, f"unknown GPU type {name!r}", unknown_gpu_fix(name))
    return gpu
