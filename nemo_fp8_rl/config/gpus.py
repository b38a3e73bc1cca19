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

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    def describe(self) -> str:
        major, minor = self.capability
        return f"{self.name} ({self.family}, compute capability {major}.{minor}, {self.memory_gib:.1f} GiB)"


GPUS: tuple[GpuType, ...] = (
    GpuType("H100", HOPPER, (9, 0), 81_559, ("h100-80gb", "h100-sxm", "h100_80gb", "hopper")),
    GpuType("H200", HOPPER, (9, 0), 143_771, ("h200-141gb", "h200_141gb")),
    GpuType("B200", BLACKWELL, (10, 0), 183_359, ("b200-180gb", "blackwell")),
    GpuType("GB200", BLACKWELL, (10, 0), 189_471, ("gb200-nvl72", "gb200_nvl")),
    GpuType("A100", OTHER, (8, 0), 81_920, ("a100-80gb", "a100_80gb", "ampere")),
)
MEMORY_TYPES = ("H100", "H200", "B200", "GB200")  # the types a memory estimate is given for


def gpu_names() -> list[str]:
    return [g.name for g in GPUS]


def find_gpu(text: str | None) -> GpuType | None:
    """The GPU type `text` names (`H100`, `h100-80gb`, `NVIDIA H200`, `gb200`), or None."""
    if not text:
        return None
    word = str(text).strip().lower().replace("nvidia", "").strip(" -_")
    for gpu in GPUS:
        if word == gpu.name.lower() or word in gpu.aliases:
            return gpu
    for gpu in sorted(GPUS, key=lambda g: -len(g.name)):  # "gb200" before "b200"
        if gpu.name.lower() in word:
            return gpu
    return None


def gpu_by_name(name: str) -> GpuType:
    gpu = find_gpu(name)
    if gpu is None:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(gpu_names())}")
    return gpu
