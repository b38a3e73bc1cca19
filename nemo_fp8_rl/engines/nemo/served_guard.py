"""FP8 active at run time on the NeMo RL engine: each generation worker's served layers are
counted at step 0 and after every refit, and a run whose FP8 layers come up BF16 stops.

The driver runs a function inside every generation worker actor (Ray's `__ray_call__`, so NeMo
RL's own `VllmGenerationWorker` needs no new method):

* a vLLM worker (`actor.llm`): vLLM's `collective_rpc` runs `_report_in_vllm_worker` in each of
  vLLM's worker processes (the ones NeMo RL's FP8 patches must reach), which counts the
  `LinearBase` layers of `model_runner.model` (`guards.served`);
* the CPU generation worker (`actor.model`, NeMo RL's loop on CPU): the same count over its
  served model, in the actor's process, where NeMo RL's `init_fp8` applied its patches.

The async vLLM engine's `collective_rpc` is a coroutine the actor's event loop would have to
await; its workers are reported as not counted. `grpo.refit_policy_generation` (NeMo RL looks it
up at call time, in `grpo_train` and `async_grpo_train`) is wrapped for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.guards.served import (
    ServedCounts,
    check_served,
    nemo_patches_in_place,
    served_layers,
)


def _report_in_vllm_worker(worker: Any) -> dict[str, Any]:
    """Runs in one of vLLM's worker processes: its served layers and patch state."""
    from vllm.model_executor.layers.linear import LinearBase

    model = worker.model_runner.model
    hf = worker.model_runner.model_config.hf_config
    counts = ServedCounts(
        served_layers(model, LinearBase),
        nemo_patches_in_place(),
        f"vLLM worker rank {getattr(worker, 'rank', '?')}",
        int(getattr(hf, "num_hidden_layers", 0)),
    )
    return counts.to_dict()


def _report_in_actor(actor: Any) -> list[dict[str, Any]]:
    """Runs in a generation worker actor (`__ray_call__`): one report per serving process."""
    llm = getattr(actor, "llm", None)
    if llm is not None:
        result = llm.collective_rpc(_report_in_vllm_worker)
        if asyncio.iscoroutine(result):
            result.close()
            return [{"skipped": "async vLLM engine: its collective_rpc is awaited by the actor"}]
        return list(result)
    model = getattr(actor, "model", None)
    if model is None or not hasattr(model, "named_modules"):
        return []  # not a model owner
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", 0)
    where = f"{type(actor).__name__} (CPU generation worker)"
    return [
        ServedCounts(served_layers(model), nemo_patches_in_place(), where, int(layers)).to_dict()
    ]


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
    for answers in ray.get([w.__ray_call__.remote(_report_in_actor) for w in workers]):
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
