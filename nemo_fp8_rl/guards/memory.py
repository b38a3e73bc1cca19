"""The memory check: a recipe's per-GPU peak against the workers' GPU, and the breakdown
`recipes show R --memory` prints (the parts are counted in `memory_model`).

Peaks per phase. Colocated (trainer and vLLM share each GPU, vLLM asleep while training):
training = trainer + vLLM asleep (its 1 GiB outside torch); refit = the trainer's parameters,
FP8 copies and overhead (gradients and optimizer offloaded, NeMo RL's `offload_before_refit`)
+ vLLM's weights; generation = vLLM (weights + KV cache + overhead) + the trainer's overhead
(parameters offloaded, `offload_after_refit`). Not colocated: the trainer's GPUs hold the
trainer, the generation GPUs vLLM.

A recipe whose peak exceeds the workers' GPU memory is refused. A colocated recipe that sizes
vLLM's KV cache by `gpu_memory_utilization` alone, on a NeMo RL pinning vLLM >= 0.25, is warned:
vLLM 0.25 sized Moonlight's KV cache at 34.29 GiB where 0.20 gave 19.83 GiB at the same 0.5,
and colocated FP8 recipes then ran out of memory at vLLM's wake-up; NeMo RL pins
`vllm_kwargs.kv_cache_memory_bytes` instead (PR #3280, issue #3412). This estimate does not
model that change (docs/guard-rails.md, "Memory estimate against published figures").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_fp8_rl.config.gpus import MEMORY_TYPES, GpuType, gpu_by_name
from nemo_fp8_rl.guards.context import VLLM, GuardContext, get_key, version_tuple
from nemo_fp8_rl.guards.findings import ERROR, WARNING, CheckResult, Finding, source_of
from nemo_fp8_rl.guards.memory_model import (
    TRAIN_OVERHEAD_GIB,
    VLLM_NON_TORCH_GIB,
    Part,
    trainer_parts,
    vllm_parts,
)

CHECK = "memory"
KV_BYTES = "policy.generation.vllm_kwargs.kv_cache_memory_bytes"


@dataclass(frozen=True)
class MemoryEstimate:
    """One recipe's per-GPU memory on one GPU type."""

    gpu: GpuType
    colocated: bool
    trainer: list[Part]
    vllm: list[Part]

    def _sum(self, parts: list[Part], *names: str) -> float:
        return sum(p.gib for p in parts if not names or p.name in names)

    @property
    def phases(self) -> dict[str, float]:
        trainer, vllm = self._sum(self.trainer), self._sum(self.vllm)
        if not self.colocated:
            return {"trainer GPUs": trainer, "generation GPUs": vllm}
        resident = self._sum(self.trainer, "parameters", "FP8 weight copies", "overhead")
        return {
            "training": trainer + VLLM_NON_TORCH_GIB,
            "refit": resident + self._sum(self.vllm, "weights") + VLLM_NON_TORCH_GIB,
            "generation": vllm + TRAIN_OVERHEAD_GIB,
        }

    @property
    def peak(self) -> tuple[str, float]:
        return max(self.phases.items(), key=lambda kv: kv[1])

    @property
    def fits(self) -> bool:
        return self.peak[1] <= self.gpu.memory_gib

    def lines(self) -> list[str]:
        out = [f"{self.gpu.describe()}, {'colocated' if self.colocated else 'not colocated'}:"]
        for side, parts in (("trainer (Megatron rank)", self.trainer), ("vLLM rank", self.vllm)):
            out.append(f"  {side}: {self._sum(parts):.1f} GiB")
            out += [f"    {p.name:<18} {p.gib:7.2f} GiB  {p.how}" for p in parts]
        phase, peak = self.peak
        shown = ", ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        verdict = "fits" if self.fits else "OVER CAPACITY"
        out.append(
            f"  peaks (GiB): {shown}; largest {phase} {peak:.1f} of {self.gpu.memory_gib:.1f}: {verdict}"
        )
        return out


def colocated(cfg: dict[str, Any]) -> bool:
    return bool(get_key(cfg, "policy.generation.colocated.enabled", True))


def trainer_world(cfg: dict[str, Any]) -> int:
    """Training GPUs: the cluster, less the generation GPUs when not colocated."""
    total = int(get_key(cfg, "cluster.num_nodes", 1)) * int(
        get_key(cfg, "cluster.gpus_per_node", 0)
    )
    if colocated(cfg):
        return total
    res = get_key(cfg, "policy.generation.colocated.resources") or {}
    gen = int(res.get("num_nodes") or 0) * int(get_key(cfg, "cluster.gpus_per_node", 0)) or int(
        res.get("gpus_per_node") or 0
    )
    return max(1, total - gen)


def estimate(cfg: dict[str, Any], hf: dict[str, Any], gpu: GpuType) -> MemoryEstimate:
    return MemoryEstimate(
        gpu,
        colocated(cfg),
        trainer_parts(cfg, hf, trainer_world(cfg)),
        vllm_parts(cfg, hf, gpu.memory_gib),
    )


def breakdown(cfg: dict[str, Any], hf: dict[str, Any], gpus: list[str] | None = None) -> str:
    """The text `recipes show R --memory` prints: every GPU type of the table (or `gpus`)."""
    lines = []
    for name in gpus or list(MEMORY_TYPES):
        lines += estimate(cfg, hf, gpu_by_name(name)).lines()
    lines.append("  (how each part is counted and the estimate's error: docs/guard-rails.md)")
    return "\n".join(lines)


def _kv_warning(ctx: GuardContext) -> Finding | None:
    pinned = (ctx.get("policy.generation.vllm_kwargs") or {}).get("kv_cache_memory_bytes")
    version = version_tuple(ctx.nemo_rl.vllm)
    if not ctx.fp8_rollout or pinned or not colocated(ctx.config):
        return None
    if version is None or version < (0, 25):
        return None
    key = f"{VLLM}.gpu_memory_utilization"
    return Finding(
        f"{CHECK}/kv-sizing",
        WARNING,
        key,
        f"colocated vLLM {ctx.nemo_rl.vllm} sizes its KV cache from gpu_memory_utilization "
        f"{ctx.get(key)} alone: vLLM 0.25 sized it up to 1.7x larger than 0.20 did at the same "
        "value (Moonlight: 34.29 vs 19.83 GiB) and colocated FP8 recipes ran out of memory at "
        "vLLM's wake-up",
        f"pin {KV_BYTES} (NeMo RL's FP8 recipes use 21474836480, 20 GiB; it takes precedence)",
        "NVIDIA-NeMo/RL PR #3280, issue #3412",
        "NeMo RL pinning vLLM >= 0.25 (main 7ea279a)",
        source_of(ctx.provenance, key),
    )


def check(ctx: GuardContext) -> CheckResult:
    """Refuse a recipe over the workers' GPU memory; warn on colocated KV sizing (module doc)."""
    if not ctx.on_gpu:
        return CheckResult(CHECK, "CPU recipe", skipped=True)
    if ctx.hf is None:
        return CheckResult(CHECK, "no config.json for the model", skipped=True)
    findings = [f for f in [_kv_warning(ctx)] if f is not None]
    if ctx.worker is None:
        est = {n: estimate(ctx.config, ctx.hf, gpu_by_name(n)) for n in MEMORY_TYPES}
        peaks = ", ".join(f"{n} {e.peak[1]:.0f}/{e.gpu.memory_gib:.0f}" for n, e in est.items())
        note = f"workers' GPU not named; peak GiB per type: {peaks}"
        if not any(e.fits for e in est.values()):
            key = "cluster.num_nodes"
            findings.append(
                Finding(
                    f"{CHECK}/capacity",
                    WARNING,
                    key,
                    f"the estimated per-GPU peak exceeds every GPU type's memory ({peaks})",
                    "more GPUs (num_nodes, parallelism) or a smaller micro-batch; name the "
                    "workers' GPU with --gpu to make this an error or a pass",
                    "estimate (docs/guard-rails.md)",
                    "",
                    source_of(ctx.provenance, key),
                )
            )
        return CheckResult(CHECK, note, findings)
    est = estimate(ctx.config, ctx.hf, ctx.worker.gpu)
    phase, peak = est.peak
    note = f"{ctx.worker.gpu.name} ({ctx.worker.how}): peak {peak:.1f} of {ctx.worker.gpu.memory_gib:.1f} GiB ({phase})"
    if not est.fits:
        key = (
            "policy.train_micro_batch_size"
            if phase in ("training", "trainer GPUs")
            else f"{VLLM}.gpu_memory_utilization"
        )
        findings.append(
            Finding(
                f"{CHECK}/capacity",
                ERROR,
                key,
                f"estimated {phase} peak {peak:.1f} GiB per GPU exceeds the {ctx.worker.gpu.name}'s "
                f"{ctx.worker.gpu.memory_gib:.1f} GiB (nemo_fp8_rl.recipes show R --memory for the parts)",
                "lower the part that dominates (micro-batch tokens, activation_checkpointing, "
                "more TP/PP/EP, or vLLM's gpu_memory_utilization / kv_cache_memory_bytes)",
                "estimate (docs/guard-rails.md)",
                "",
                source_of(ctx.provenance, key),
            )
        )
    return CheckResult(CHECK, note, findings)
