"""Runs in a generation worker actor (Ray's `__ray_call__`, from `driver.served_guard`): the
linear layers each serving process holds, per precision (`guards.served`).

* a vLLM generation worker (`actor.llm`): vLLM's `collective_rpc` runs `report_in_vllm_worker`
  in each of vLLM's worker processes (the ones NeMo RL's FP8 patches must reach), which counts
  the `LinearBase` layers of `model_runner.model`;
* the CPU generation worker (`actor.model`, NeMo RL's loop on CPU): the same count over its
  served model, in the actor's process, where NeMo RL's `init_fp8` applied its patches.

The async vLLM engine's `collective_rpc` is a coroutine the actor's event loop would have to
await; its workers answer `{"skipped": why}`. Answers are plain dicts (`ServedCounts.to_dict`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nemo_fp8_rl.guards.served import ServedCounts, nemo_patches_in_place, served_layers


def report_in_vllm_worker(worker: Any) -> dict[str, Any]:
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


def report_in_actor(actor: Any) -> list[dict[str, Any]]:
    """Runs in a generation worker actor (`__ray_call__`): one report per serving process."""
    llm = getattr(actor, "llm", None)
    if llm is not None:
        result = llm.collective_rpc(report_in_vllm_worker)
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
