"""`CpuMegatronPolicyWorker`: the policy worker NeMo RL's `Policy` builds for the CPU loop.

NeMo RL's own `MegatronPolicyWorker` cannot run here. On main (7ea279a) importing
`nemo_rl.models.policy.workers.megatron_policy_worker` in the contract environment fails with
`ModuleNotFoundError: No module named 'megatron.bridge'`, and with megatron-bridge present its
next import, `from megatron.core.distributed.fsdp.mcore_fsdp_adapter import
FullyShardedDataParallelV1`, fails on megatron-core 0.19.2 from PyPI (`ImportError: cannot
import name 'FullyShardedDataParallelV1'`); its `__init__` then calls
`torch.cuda.set_device(local_rank)` and `torch.distributed.init_process_group("nccl")`.

This worker implements, with the same argument names and return shapes, the methods
`Policy` and `grpo_train` call on their workers through `RayWorkerGroup`
(`run_all_workers_single_data` / `_sharded_data`) in a colocated run refitted over IPC-ZMQ:
`train`, `get_logprobs`, `get_reference_policy_logprobs`, `prepare_for_training`,
`prepare_for_lp_inference`, `finish_inference`, `finish_training`, `offload_before_refit`,
`offload_after_refit`, `prepare_refit_info`, `stream_weights_via_ipc_zmq`,
`get_free_memory_bytes`, `report_device_id`, `init_collective` and
`broadcast_weights_for_collective` (non-colocated refit, gloo in place of NCCL: `collective`), `report_node_ip_and_gpu_id`, `save_checkpoint`,
`finalize_async_save`, `shutdown`, `calibrate_qkv_fp8_scales` (FP8 KV cache); plus the project's `set_fp8_compute` and
`hold_lr_schedule`. It runs on real megatron-core 0.19.2: a local-spec `GPTModel` built from
the checkpoint folder `policy.model_name` (`megatron_model`), megatron-core's DDP, its
`get_forward_backward_func()` with NeMo RL's loss wrapper (`steps`, `train_loop`), its
optimizer and `OptimizerParamScheduler` (`optim`), FP8 emulated in the decoder linears
behind `TransformerConfig.fp8` (`fp8_linear`), and the CPU shim of `cuda_shim` (its
docstring lists each entry with the measured reason). Refit streams HF-named weights through
NeMo RL's `stream_weights_via_ipc_zmq_impl` with the shared-memory handles of `ipc`, on the
socket `device.zmq_address()`.

`CpuTrainerFp8MegatronPolicyWorker` is the same worker whose refit stream carries
trainer-quantized FP8 pairs (`trainer_refit.QuantizeOnTrainer`, `refit.quantize_on: trainer`).
Memory placement methods are no-ops: every tensor already lives in host memory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import ray
import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.models.policy.workers.base_policy_worker import AbstractPolicyWorker

from nemo_fp8_rl.config.user_error import UsageError, UserError
from nemo_fp8_rl.engines.nemo.cpu import (
    checkpoint_io,
    cuda_shim,
    device,
    ipc,
    kv_calibration,
    optim,
    steps,
    train_loop,
)
from nemo_fp8_rl.engines.nemo.cpu import megatron_model as mm
from nemo_fp8_rl.engines.nemo.cpu import worker_setup as setup
from nemo_fp8_rl.engines.nemo.worker.shadow_controls import ShadowControls
from nemo_fp8_rl.engines.nemo.worker.trainer_refit import QuantizeOnTrainer

REFIT_STAGING_CAP = 64 * 1024**2  # bytes reported free: NeMo RL stages 30 % of it, twice


class ExportFacts:
    """What the project's `QuantizeOnTrainer` reads of NeMo RL's megatron-bridge object."""

    def __init__(self, transformer_config: Any) -> None:
        self.transformer_config = transformer_config


class CpuMegatronPolicyWorkerImpl(ShadowControls, AbstractPolicyWorker):
    """The worker's implementation (Ray actor classes cannot be subclassed; see below)."""

    @staticmethod
    def configure_worker(
        num_gpus: int | float, bundle_indices: Any = None, num_gpus_per_node: Any = None
    ) -> tuple[dict, dict, dict, dict]:
        """Ray options: the bundle's logical GPU share, nothing else."""
        return {"num_gpus": num_gpus}, {}, {}, {}

    def __init__(
        self,
        config: dict[str, Any],
        tokenizer: Any,
        weights_path: str | None = None,
        optimizer_path: str | None = None,
        init_optimizer: bool = True,
        init_reference_model: bool = True,
        *,
        worker_sharding_annotations: Any = None,
        skip_weight_load: bool = False,
        **kwargs: Any,
    ) -> None:
        cuda_shim.install()
        ipc.install()
        self.cfg = config
        meg = config["megatron_cfg"]
        setup.check_parallelism(meg)
        setup.init_distributed()
        self.rank = torch.distributed.get_rank()
        self.dp_size = torch.distributed.get_world_size()
        self.tokenizer = tokenizer
        if tokenizer is not None and tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.dtype = torch.bfloat16 if setup.precision_bf16(config) else torch.float32
        self.fp8_cfg = meg.get("fp8_cfg")
        self.sampling_params = _sampling_params(config)
        self.hf_config, self.model_config, module = setup.build_model(config)
        self.megatron_bridge = ExportFacts(self.model_config)
        self.reference_state_dict = _state_copy(module) if init_reference_model else None
        self.model = setup.wrap_ddp(module, self.model_config, meg)
        self.optimizer = self.scheduler = None
        self.clip_grad = 0.0
        if init_optimizer:
            gbs = config["train_global_batch_size"]
            with cuda_shim.cpu_devices():
                self.optimizer, self.scheduler, self.clip_grad = optim.build(self.model, meg, gbs)
        setup.hook_grads(self.model, self.model_config, self.optimizer)
        if weights_path:
            self._load(weights_path, optimizer_path)

    # ---- training and logprobs ---------------------------------------------------------

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: Any,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        check_dim_skip_keys: Any = None,
    ) -> dict[str, Any]:
        """NeMo RL's Megatron `train` contract (`train_loop`)."""
        if check_dim_skip_keys is not None:
            raise UsageError(
                "CPU policy worker train",
                "check_dim_skip_keys is only supported by NeMo RL's v2 DTensor worker",
                "pass None",
            )
        if not eval_mode and self.optimizer is None:
            raise UserError(
                "CPU policy worker train",
                "built with init_optimizer=False",
                "build the Policy with init_optimizer=True to train",
            )
        gbs = gbs or self.cfg["train_global_batch_size"]
        mbs = mbs or self.cfg["train_micro_batch_size"]
        return train_loop.train(self, data, loss_fn, eval_mode, gbs, mbs)

    @torch.no_grad()
    def get_logprobs(
        self,
        *,
        data: BatchedDataDict,
        micro_batch_size: int | None = None,
        require_router_replay: bool = True,
    ) -> BatchedDataDict:
        """`{"logprobs": [B, S]}`: logprob of token i at position i, 0 at position 0.

        Microbatches of `logprob_batch_size` (or `micro_batch_size`), at most the shard.
        """
        mbs = min(micro_batch_size or self.cfg["logprob_batch_size"], data.size)
        self.model.eval()
        seq = data["input_ids"].shape[1]
        mbatches = list(data.make_microbatch_iterator(mbs))

        def make_post(mb: Any) -> Any:
            return steps.logprobs_function(mb, self.cfg, self.sampling_params)

        with cuda_shim.cpu_devices():
            outputs = steps.run(self.model, mbatches, make_post, forward_only=True)
        padded = [
            torch.nn.functional.pad(o["logprobs"], (0, seq - o["logprobs"].shape[1]))
            for o in outputs
        ]
        return BatchedDataDict(logprobs=torch.cat(padded, dim=0).cpu())

    @torch.no_grad()
    def calibrate_qkv_fp8_scales(
        self,
        *,
        data: BatchedDataDict,
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]:
        """FP8 KV-cache scales from one logprob pass over `data` (`kv_calibration`)."""
        return kv_calibration.calibrate(self, data, micro_batch_size, percentile, margin, include_q)

    @contextlib.contextmanager
    def use_reference_model(self) -> Iterator[None]:
        """The reference weights in the model for the block (top-k/top-p off, as NeMo RL)."""
        if self.reference_state_dict is None:
            raise UserError(
                "CPU policy worker",
                "built with init_reference_model=False",
                "build the Policy with init_reference_model=True for reference logprobs",
            )
        module = self.model.module
        saved = _state_copy(module)
        saved_params = self.sampling_params
        with torch.no_grad():
            module.load_state_dict(self.reference_state_dict)
        if saved_params is not None:
            from nemo_rl.algorithms.logits_sampling_utils import TrainingSamplingParams

            self.sampling_params = TrainingSamplingParams(
                top_k=None, top_p=1.0, temperature=saved_params.temperature
            )
        try:
            yield
        finally:
            self.sampling_params = saved_params
            with torch.no_grad():
                module.load_state_dict(saved)

    # ---- placement (host memory only) --------------------------------------------------

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        self.model.train()

    def prepare_for_lp_inference(self, keep_train_buffers: bool = False) -> None:
        self.model.eval()

    def finish_inference(self) -> None:
        self.model.eval()

    def offload_before_refit(self) -> None:
        """Nothing to move: the optimizer state is in host memory already."""

    def offload_after_refit(self) -> None:
        """Nothing to move: the weights are in host memory already."""

    def offload_to_cpu(self) -> None:
        """Nothing to move."""

    # ---- refit ---------------------------------------------------------------------------

    def _iter_params_with_optional_kv_scales(
        self, kv_scales: dict[str, float] | None = None, conversion_tasks: Any = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named weights in the export dtype, then FP8 KV-cache scales if vLLM uses them."""
        yield from mm.hf_named_weights(self.model.module, self.model_config, self.dtype)
        vllm_cfg = (self.cfg.get("generation") or {}).get("vllm_cfg") or {}
        if not str(vllm_cfg.get("kv_cache_dtype", "auto")).startswith("fp8"):
            return
        from nemo_rl.models.generation.vllm.quantization.fp8_train_utils import (
            get_vllm_qkv_scale_names,
        )

        for layer in range(self.model_config.num_layers):
            for name in get_vllm_qkv_scale_names(layer).values():
                value = (kv_scales or {}).get(name, 1.0)
                yield name, torch.tensor(value, dtype=torch.float32).reshape(1)

    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """`{hf_name: (shape, dtype)}` of the refit stream, as NeMo RL's Megatron worker."""
        return {n: (t.shape, t.dtype) for n, t in self._iter_params_with_optional_kv_scales()}

    @torch.no_grad()
    def stream_weights_via_ipc_zmq(
        self, buffer_size_bytes: int = 0, kv_scales: dict[str, float] | None = None
    ) -> None:
        """NeMo RL's `stream_weights_via_ipc_zmq_impl` over the refit stream."""
        from nemo_rl.models.policy import utils as policy_utils

        self.maybe_init_zmq()
        policy_utils.stream_weights_via_ipc_zmq_impl(
            params_generator=self._iter_params_with_optional_kv_scales(kv_scales=kv_scales),
            buffer_size_bytes=buffer_size_bytes,
            zmq_socket=self.zmq_socket,
            rank=self.rank,
            worker_name=str(self),
        )

    def init_collective(
        self,
        ip: str,
        port: int,
        world_size: int,
        *,
        train_world_size: int,
        nccl_peer: str = "nemo",
    ) -> None:
        """The non-colocated refit group (NeMo RL's rank: this worker's), on gloo (`collective`)."""
        from nemo_fp8_rl.engines.nemo.cpu.collective import GlooRefitGroup

        self.model_update_group = GlooRefitGroup(ip, port, self.rank, world_size)

    @torch.no_grad()
    def broadcast_weights_for_collective(
        self,
        kv_scales: dict[str, float] | None = None,
        *,
        buffer_size_bytes: int | None = None,
        num_buffers: int | None = None,
    ) -> None:
        """NeMo RL's `packed_broadcast_producer` over the refit stream, from rank 0."""
        from nemo_rl.utils import packed_tensor

        from nemo_fp8_rl.engines.nemo.cpu.collective import cpu_packing

        sizes = {"buffer_size_bytes": buffer_size_bytes, "num_buffers": num_buffers}
        with cpu_packing():
            packed_tensor.packed_broadcast_producer(
                iterator=self._iter_params_with_optional_kv_scales(kv_scales=kv_scales),
                group=self.model_update_group,
                src=0,
                post_iter_func=lambda item: item[1],
                **{k: v for k, v in sizes.items() if v is not None},  # v0.7.0 takes neither
            )

    # ---- device facts ------------------------------------------------------------------

    def report_device_id(self) -> str:
        """The CPU device id both refit ends compute (`device.device_uuid`)."""
        return device.device_uuid()

    def get_zmq_address(self) -> str:
        return device.zmq_address()

    def get_free_memory_bytes(self) -> int:
        """Available host memory, capped at `REFIT_STAGING_CAP`: NeMo RL sizes its refit
        staging buffers from this, and the CPU handles copy whole buffers to shared memory."""
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(min(avail, REFIT_STAGING_CAP))

    def report_node_ip_and_gpu_id(self) -> tuple[str, int]:
        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
        return ip, int(float(gpu_ids[0])) if gpu_ids else 0

    def reset_peak_memory_stats(self) -> None:
        """No CUDA allocator to reset."""

    def start_gpu_profiling(self) -> None:
        """No GPU profiler on the CPU."""

    def stop_gpu_profiling(self) -> None:
        """No GPU profiler on the CPU."""

    # ---- checkpoints -------------------------------------------------------------------

    def save_checkpoint(
        self, weights_path: str, optimizer_path: str | None = None, **kwargs: Any
    ) -> None:
        """Model (and optimizer + scheduler) state, written atomically (`checkpoint_io`)."""
        optim_state = None
        if optimizer_path is not None and self.optimizer is not None:
            optim_state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
        checkpoint_io.save(
            self.model.module.state_dict(), weights_path, optim_state, optimizer_path
        )

    def load_checkpoint(self, weights_path: str, optimizer_path: str | None = None) -> None:
        self._load(weights_path, optimizer_path)

    def _load(self, weights_path: str, optimizer_path: str | None) -> None:
        with torch.no_grad():
            self.model.module.load_state_dict(checkpoint_io.load_model(weights_path))
        if optimizer_path and self.optimizer is not None:
            state = checkpoint_io.load_optim(optimizer_path)
            with cuda_shim.cpu_devices():
                self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])

    def __repr__(self) -> str:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else "-"
        return f"{type(self).__qualname__}[rank={rank}]"


def _state_copy(module: torch.nn.Module) -> dict[str, Any]:
    """A detached copy of `module.state_dict()` (non-tensor `_extra_state` entries as they are)."""
    return {
        k: v.detach().clone() if isinstance(v, torch.Tensor) else v
        for k, v in module.state_dict().items()
    }


def _sampling_params(config: dict[str, Any]) -> Any:
    """NeMo RL's `TrainingSamplingParams` from `policy.generation` (None without it)."""
    gen = config.get("generation")
    if gen is None:
        return None
    from nemo_rl.algorithms.logits_sampling_utils import TrainingSamplingParams

    return TrainingSamplingParams(
        top_k=gen.get("top_k"), top_p=gen.get("top_p", 1.0), temperature=gen.get("temperature", 1.0)
    )


class CpuTrainerFp8MegatronPolicyWorkerImpl(QuantizeOnTrainer, CpuMegatronPolicyWorkerImpl):
    """The CPU worker whose refit stream carries trainer-quantized FP8 pairs."""


@ray.remote  # pragma: no cover
class CpuMegatronPolicyWorker(CpuMegatronPolicyWorkerImpl):
    """The CPU policy worker as a Ray actor (`cpu.loop.POLICY_WORKER`)."""


@ray.remote  # pragma: no cover
class CpuTrainerFp8MegatronPolicyWorker(CpuTrainerFp8MegatronPolicyWorkerImpl):
    """The trainer-side FP8 refit variant as a Ray actor (`cpu.loop.TRAINER_FP8_POLICY_WORKER`)."""
