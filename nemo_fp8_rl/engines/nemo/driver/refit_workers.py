"""Which NeMo RL workers the engine starts for `refit.quantize_on` (driver side).

`generator` (default): NeMo RL's own policy worker, or the shadow worker when calibrating;
NeMo RL's refit runs unchanged, received by `generation_worker.CheckedVllmGenerationWorker`
(NeMo RL's vLLM worker whose extension checks the refit metadata against the served model
before storing it, `generator_refit_check`). `trainer`: both ends of the refit are the project's:

* policy: `worker.TrainerFp8MegatronPolicyWorker` (the shadow worker whose refit stream carries
  FP8 pairs), passed to NeMo RL's `Policy` as `worker_extension_cls_fqn`;
* generation: `generation_worker.TrainerFp8VllmGenerationWorker` (or, with the async engine,
  `TrainerFp8VllmAsyncGenerationWorker`). `VllmGeneration` is built
  inside `grpo.setup` and picks its worker class through `resolve_generation_worker_cls`
  (imported into `nemo_rl.models.generation.vllm.vllm_generation`), the hook NeMo RL's own
  ModelOpt path uses; `trainer_generation_worker()` answers the project's class there for
  NeMo RL's synchronous or async worker while `setup` runs.

Each project worker is registered under the interpreter of the NeMo RL worker it extends
(`worker_env.register_worker`), so NeMo RL's prebuilt environments are reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.nemo.driver.worker_env import (
    ASYNC_GENERATION_WORKER_FQN,
    CHECKED_ASYNC_GENERATION_WORKER_FQN,
    CHECKED_GENERATION_WORKER_FQN,
    GENERATION_WORKER_FQN,
    MEGATRON_WORKER_FQN,
    TRAINER_FP8_WORKER_FQN,
    VLLM_ASYNC_WORKER_FQN,
    VLLM_WORKER_FQN,
    WORKER_FQN,
    register_worker,
)

# NeMo RL's vLLM worker -> the project's worker extending it, per `refit.quantize_on`
REPLACED = {
    VLLM_WORKER_FQN: GENERATION_WORKER_FQN,
    VLLM_ASYNC_WORKER_FQN: ASYNC_GENERATION_WORKER_FQN,
}
CHECKED = {
    VLLM_WORKER_FQN: CHECKED_GENERATION_WORKER_FQN,
    VLLM_ASYNC_WORKER_FQN: CHECKED_ASYNC_GENERATION_WORKER_FQN,
}


class GenerationWorkerError(UserError, RuntimeError):
    """NeMo RL chose a vLLM worker the trainer-side FP8 refit cannot replace."""


def policy_worker_fqn(*, calibrated: bool, quantize_on: str) -> str | None:
    """The project's Megatron worker class path, or None for NeMo RL's own worker."""
    if quantize_on == "trainer":
        return TRAINER_FP8_WORKER_FQN
    return WORKER_FQN if calibrated else None


def make_policy_factory(fqn: str | None) -> Any:
    """A `grpo.setup(policy_factory=...)` building NeMo RL's `Policy` with worker `fqn` (None:
    NeMo RL's default). The worker is registered when `setup` builds the policy (Ray is up)."""
    if fqn is None:
        return None
    from nemo_rl.models.policy.lm_policy import Policy

    def make_policy(*args: Any, **kwargs: Any) -> Any:
        executable = register_worker(fqn, MEGATRON_WORKER_FQN)
        print(f"policy worker: {fqn} with the Megatron worker's Python {executable}")
        return Policy(*args, worker_extension_cls_fqn=fqn, **kwargs)

    return make_policy


def resolver(original: Any, quantize_on: str = "trainer") -> Any:
    """`resolve_generation_worker_cls` answering the project's vLLM worker for NeMo RL's
    synchronous or async one (`REPLACED` for `trainer`, `CHECKED` for `generator`); with
    `generator`, another worker NeMo RL chooses (ModelOpt's, ...) is kept as it is."""
    replaced = REPLACED if quantize_on == "trainer" else CHECKED

    def resolve(default_cls: str, config: dict) -> str:
        chosen = original(default_cls, config)
        if chosen not in replaced and quantize_on != "trainer":
            return chosen
        if chosen not in replaced:
            raise GenerationWorkerError(
                "policy.generation",
                f"NeMo RL chose the vLLM worker {chosen}, which "
                "refit.quantize_on: trainer cannot replace (it extends "
                f"{' and '.join(REPLACED)} only)",
                "set refit.quantize_on: generator",
            )
        project = replaced[chosen]
        executable = register_worker(project, chosen)
        print(f"generation worker: {project} with the vLLM worker's Python {executable}")
        return project

    return resolve


@contextlib.contextmanager
def trainer_generation_worker(quantize_on: str) -> Iterator[None]:
    """While `grpo.setup` runs: `VllmGeneration` starts the project's worker (`trainer`: the
    trainer-quantized FP8 refit; `generator`: NeMo RL's refit with the metadata checked)."""
    from nemo_rl.models.generation.vllm import vllm_generation

    original = vllm_generation.resolve_generation_worker_cls
    vllm_generation.resolve_generation_worker_cls = resolver(original, quantize_on)
    try:
        yield
    finally:
        vllm_generation.resolve_generation_worker_cls = original
