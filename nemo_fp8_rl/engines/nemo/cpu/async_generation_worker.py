"""The CPU generation worker behind NeMo RL's async engine (`vllm_cfg.async_engine: true`).

With the async engine NeMo RL's `VllmGeneration` builds `VllmAsyncGenerationWorker` and calls
the `*_async` twins of the synchronous worker's methods (`post_init_async`,
`report_device_id_async`, `init_collective_async`, `prepare_refit_info_async`,
`update_weights_via_ipc_zmq_async`, `update_weights_from_collective_async`,
`reset_prefix_cache_async`, `sleep_async`, `wake_up_async`) and generates one prompt per
request through `generate_async`, an async generator yielding `(index, output)` that NeMo RL
streams from the Ray actor (`run_single_worker_single_data` on an async-generator method).
This worker is the CPU worker (`generation_worker`) with those methods: each runs the
synchronous one to completion on the actor's event loop, so requests, refits and sleeps are
served one at a time, as one vLLM engine step would order them. Each request samples with its
own generator (the worker seed, the request number and the prompt), so the n requests of one
prompt group draw n different answers, as vLLM's per-request sampling does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import ray
import torch

from nemo_fp8_rl.engines.nemo.cpu import generation_io as gio
from nemo_fp8_rl.engines.nemo.cpu import generation_worker as gw

MODULE = "nemo_fp8_rl.engines.nemo.cpu.async_generation_worker"
GENERATOR_WORKER_FQN = f"{MODULE}.CpuAsyncGenerationWorker"
TRAINER_WORKER_FQN = f"{MODULE}.CpuTrainerFp8AsyncGenerationWorker"
ASYNC_VLLM_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"


class AsyncEngineMethods:
    """The async engine's methods over a `CpuGenerationWorkerImpl` (see the module doc)."""

    serves_async_engine = True
    requests = 0

    def _batch_generator(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> Any:
        self.requests += 1
        return gio.batch_generator(self.seed, input_ids, lengths, salt=self.requests)

    def load_model(self) -> None:
        """The deferred model load (`defer_model_load=True`), on the model owner."""
        if self.is_model_owner and self.model is None:
            self._load_model()

    async def get_reserved_url(self) -> str | None:
        """No HTTP server is reserved (`expose_http_server` is not served on CPU)."""
        return None

    async def post_init_async(self) -> None:
        self.post_init()

    async def report_device_id_async(self) -> list[str]:
        return self.report_device_id()

    async def init_collective_async(
        self, rank_prefix: int, ip: str, port: int, world_size: int, train_world_size: int
    ) -> None:
        self.init_collective(rank_prefix, ip, port, world_size, train_world_size)

    async def generate_async(self, data: Any, greedy: bool = False) -> AsyncIterator[Any]:
        """One prompt per request (NeMo RL's restriction); yields `(0, output)`."""
        if len(data["input_ids"]) == 0:
            return
        if len(data["input_ids"]) != 1:
            raise gw._refuse(
                "CpuAsyncGenerationWorker.generate_async",
                f"received a batch of {len(data['input_ids'])} prompts",
                "send one prompt per request (NeMo RL's VllmGeneration.generate_async does)",
            )
        yield 0, self.generate(data, greedy)

    async def generate_text_async(self, data: Any, greedy: bool = False) -> AsyncIterator[Any]:
        """Text prompts one at a time: yields `(index, {"texts": [text]})`."""
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        for i, prompt in enumerate(data["prompts"]):
            out = self.generate_text(BatchedDataDict({"prompts": [prompt]}), greedy)
            yield i, out

    async def prepare_refit_info_async(self, state_dict_info: dict[str, Any]) -> None:
        self.prepare_refit_info(state_dict_info)

    async def update_weights_via_ipc_zmq_async(self) -> bool:
        return self.update_weights_via_ipc_zmq()

    async def update_weights_from_collective_async(self) -> bool:
        return self.update_weights_from_collective()

    async def reset_prefix_cache_async(self) -> None:
        self.reset_prefix_cache()

    async def sleep_async(self) -> None:
        self.sleep()

    async def wake_up_async(self, **kwargs: Any) -> None:
        self.wake_up(**kwargs)


class CpuAsyncGenerationWorkerImpl(AsyncEngineMethods, gw.CpuGenerationWorkerImpl):
    """`refit.quantize_on: generator` with the async engine."""


class CpuTrainerFp8AsyncGenerationWorkerImpl(
    AsyncEngineMethods, gw.CpuTrainerFp8GenerationWorkerImpl
):
    """`refit.quantize_on: trainer` with the async engine."""


@ray.remote  # pragma: no cover
class CpuAsyncGenerationWorker(gw._RayEntry, CpuAsyncGenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds with the async engine (`generator`)."""


@ray.remote  # pragma: no cover
class CpuTrainerFp8AsyncGenerationWorker(gw._RayEntry, CpuTrainerFp8AsyncGenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds with the async engine (`trainer`)."""


def worker_fqn(quantize_on: str) -> str:
    """The async CPU worker class path for `refit.quantize_on`."""
    gw.worker_fqn(quantize_on)  # refuses an unknown mode
    return TRAINER_WORKER_FQN if quantize_on == "trainer" else GENERATOR_WORKER_FQN
