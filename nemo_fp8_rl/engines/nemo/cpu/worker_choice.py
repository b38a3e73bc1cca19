"""Which CPU generation worker NeMo RL's `VllmGeneration` builds: for `VllmGenerationWorker` and
`VllmAsyncGenerationWorker` (`async_engine: true`), NeMo RL's own worker on real vLLM
(`cpu.vllm_worker`) where `cpu.vllm_choice` says it can run, else the stand-in
(`cpu.generation_worker`, `cpu.async_generation_worker`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nemo_fp8_rl.engines.nemo.cpu import async_generation_worker as agw
from nemo_fp8_rl.engines.nemo.cpu import generation_worker as gw


def replacements(quantize_on: str, real_vllm: bool) -> dict[str, str]:
    """NeMo RL's vLLM worker class path -> the CPU worker's, for each engine kind."""
    gw.worker_fqn(quantize_on)  # refuses an unknown mode
    if real_vllm:
        from nemo_fp8_rl.engines.nemo.cpu import vllm_worker as vw

        return {
            gw.SYNC_VLLM_WORKER_FQN: vw.worker_fqn(quantize_on, async_engine=False),
            agw.ASYNC_VLLM_WORKER_FQN: vw.worker_fqn(quantize_on, async_engine=True),
        }
    return {
        gw.SYNC_VLLM_WORKER_FQN: gw.worker_fqn(quantize_on),
        agw.ASYNC_VLLM_WORKER_FQN: agw.worker_fqn(quantize_on),
    }


@contextlib.contextmanager
def cpu_generation_worker(quantize_on: str = "generator", real_vllm: bool = False) -> Iterator[str]:
    """While `grpo.setup` builds `VllmGeneration`, NeMo RL's `resolve_generation_worker_cls`
    (as imported into `vllm_generation`) answers the CPU worker for NeMo RL's synchronous vLLM
    worker, and the async CPU worker for its async one; yields the synchronous class path."""
    from nemo_rl.models.generation.vllm import vllm_generation

    replaced = replacements(quantize_on, real_vllm)
    original = vllm_generation.resolve_generation_worker_cls

    def resolve(default_cls: str, config: dict) -> str:
        chosen = original(default_cls, config)
        if chosen not in replaced:
            raise gw._refuse(
                "policy.generation",
                f"NeMo RL chose the generation worker {chosen}; the CPU loop replaces "
                f"{' and '.join(replaced)} only",
                "use NeMo RL's vLLM backend without a quantization worker",
            )
        print(f"generation worker: {replaced[chosen]}", flush=True)
        return replaced[chosen]

    vllm_generation.resolve_generation_worker_cls = resolve
    try:
        yield replaced[gw.SYNC_VLLM_WORKER_FQN]
    finally:
        vllm_generation.resolve_generation_worker_cls = original
