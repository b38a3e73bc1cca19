"""The GPU types a recipe's workers can have: family, compute capability, memory.

The FP8 decisions that depend on the GPU (which scale format, whether MXFP8 exists, how much
memory there is) are made for the GPU the *workers* have, named by `--gpu`, `slurm.gpu` or the
Slurm partition's GRES/features (`nemo_fp8_rl.guards.worker_gpu`), never for the GPU of the
machine the command runs on (a login or head node may have none, or another one).

`memory_gib` is what one process can allocate on the GPU (`nvidia-smi`'s memory.total, which
is also `torch.cuda.get_device_properties(0).total_memory`): H100 SXM 80 GB reports 81,559 MiB,
H200 143,771 MiB, B200 183,359 MiB and GB200 189,471 MiB. FP8 tensor cores start at compute
capability 8.9 (Ada); Hopper is 9.0, the Blackwell data-centre parts 10.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HOPPER, BLACKWELL, OTHER = "hopper", "blackwell", "other"


@dataclass(frozen=True)
class GpuType:
    """One GPU model: its name, architecture family, compute capability and usable memory."""

    name: str
    family: str
    capability: tuple[int, int]
    memory_mib: int
    aliases: tuple[str, ...] = ()
    nominal_gb: tuple[int, ...] = ()  # the memory sizes its names carry (`h100-80gb`)

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    def describe(self) -> str:
        major, minor = self.capability
        return f"{self.name} ({self.family}, compute capability {major}.{minor}, {self.memory_gib:.1f} GiB)"


GPUS: tuple[GpuType, ...] = (
    GpuType(
        "H100", HOPPER, (9, 0), 81_559, ("h100-80gb", "h100-sxm", "h100_80gb", "hopper"), (80,)
    ),
    GpuType("H200", HOPPER, (9, 0), 143_771, ("h200-141gb", "h200_141gb"), (141,)),
    GpuType("B200", BLACKWELL, (10, 0), 183_359, ("b200-180gb", "blackwell"), (180, 192)),
    GpuType("GB200", BLACKWELL, (10, 0), 189_471, ("gb200-nvl72", "gb200_nvl"), (186, 192)),
    GpuType("A100", OTHER, (8, 0), 81_920, ("a100-80gb", "a100_80gb", "ampere"), (80,)),
)
MEMORY_TYPES = ("H100", "H200", "B200", "GB200")  # the types a memory estimate is given for


def gpu_names() -> list[str]:
    return [g.name for g in GPUS]


def _normal(text: str) -> str:
    """`text` as names are compared: lower case, without an `NVIDIA` prefix or outer - _ space."""
    word = str(text).strip().lower()
    word = word.removeprefix("nvidia").strip(" -_")
    return word


def find_gpu(text: str | None) -> GpuType | None:
    """The GPU type `text` names exactly (`H100`, `h100-80gb`, `NVIDIA H200`, `gb200`), or None.
    A near miss (`H100x`, `GH200`, `a100-40gb`) names no type: a substring match would take
    `GH200` for an H200 and check an A100 40GB against 80 GiB."""
    if not text:
        return None
    word = _normal(text)
    for gpu in GPUS:
        if word == gpu.name.lower() or word in gpu.aliases:
            return gpu
    return None


def nearest_gpu(text: str) -> str | None:
    """The known name or alias closest to `text` (for "did you mean"), or None."""
    import difflib

    names = [n for g in GPUS for n in (g.name.lower(), *g.aliases)]
    close = difflib.get_close_matches(_normal(text), names, n=1, cutoff=0.5)
    return find_gpu(close[0]).name if close else None  # type: ignore[union-attr]


def unknown_gpu_fix(text: str) -> str:
    """The fix of an unknown GPU type: the nearest name, then the closed list."""
    near = nearest_gpu(text)
    listed = f"one of {', '.join(gpu_names())}"
    return f"did you mean {near}? (the types are {listed})" if near else f"use {listed}"


def gpu_in_words(text: str) -> GpuType | None:
    """The GPU type a Slurm GRES type or node feature names (`h100`, `nvidia_h100_80gb_hbm3`,
    `gpu-a100-80gb`): its words (split at - _ . and space) hold a type's name whole, and any
    memory size word (`40gb`) matches that type's; else None (`gh200` is no H200)."""
    words = [w for w in re.split(r"[-_.\s]+", str(text).lower()) if w and w != "nvidia"]
    for gpu in GPUS:
        if gpu.name.lower() in words:
            sizes = {int(w[:-2]) for w in words if re.fullmatch(r"\d+gb", w)}
            if not sizes or sizes <= set(gpu.nominal_gb):
                return gpu
    return None


def gpu_by_name(name: str) -> GpuType:
    gpu = find_gpu(name)
    if gpu is None:
        raise KeyError(f"unknown GPU type {name!r}; {unknown_gpu_fix(name)}")
    return gpu
