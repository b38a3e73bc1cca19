"""FP8 active at run time on the NeMo RL engine: each generation worker's served layers are
counted at step 0 and after every refit, and a run whose FP8 layers come up BF16 stops.

The driver runs `worker.served_report.report_in_actor` inside every generation worker actor
(Ray's `__ray_call__`, so NeMo RL's own `VllmGenerationWorker` needs no new method), which
counts the served layers in each process that serves the model (vLLM's workers, or the CPU
generation worker's own process); the async vLLM engine's workers are reported as not counted. `grpo.refit_policy_generation` (NeMo RL looks it
up at call time, in `grpo_train` and `async_grpo_train`) is wrapped for the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.engines.nemo.worker.served_report import report_in_actor
from nemo_fp8_rl.guards.served import ServedCounts, check_served


def collect(policy_generation: Any) -> tuple[list[ServedCounts], list[str]]:
    """(reports, notes) from every generation worker of NeMo RL's `VllmGeneration`."""
    import ray

    group = getattr(policy_generation, "worker_group", None)
    workers = [
        w for w in getattr(group, "workers", None) or [] if isinstance(w, ray.actor.ActorHandle)
    ]
    if not workers:  # none, or the preflight's recorded workers (nothing runs there)
        return [], []
    reports, notes = [], []
    for answers in ray.get([w.__ray_call__.remote(report_in_actor) for w in workers]):
        for answer in answers:
            if "skipped" in answer:
                notes.append(f"served-precision: not counted: {answer['skipped']}")
            else:
                reports.append(ServedCounts.from_dict(answer))
    return reports, notes


def check_generation(policy_generation: Any, vllm_cfg: dict[str, Any], when: str) -> list[str]:
    """Count and check (raises `ServedPrecisionError`); returns the lines to log."""
    reports, notes = collect(policy_generation)
    return [
        f"served-precision ({when}): {line}" for line in check_served(reports, vllm_cfg, when)
    ] + notes


@contextlib.contextmanager
def served_guard(grpo: Any, vllm_cfg: dict[str, Any], policy_generation: Any) -> Iterator[None]:
    """Check at step 0, and after every refit while the block runs (module docstring)."""
    for line in check_generation(policy_generation, vllm_cfg, "step 0"):
        print(line, flush=True)
    original = grpo.refit_policy_generation
    refits = [0]

    def refit_then_check(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        refits[0] += 1
        generation = (
            args[1] if len(args) > 1 else kwargs.get("policy_generation", policy_generation)
        )
        for line in check_generation(generation, vllm_cfg, f"after refit {refits[0]}"):
            if refits[0] == 1:
                print(line, flush=True)
        return result

    grpo.refit_policy_generation = refit_then_check
    try:
        yield
    finally:
        grpo.refit_policy_generation = original
