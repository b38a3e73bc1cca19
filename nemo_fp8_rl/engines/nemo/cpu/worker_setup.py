"""Construction of the CPU policy worker's parts: process group, model, DDP, optimizer.

Everything is megatron-core as shipped, on gloo: `torch.distributed` from the environment
NeMo RL's `RayWorkerGroup` sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) or, for a
worker built in-process, a one-rank group on a file store; model-parallel state of size 1
(TP = PP = CP = 1; data parallelism over the workers); the DDP wrapper of megatron-core with
its gradient buffers; `finalize_model_grads` and the loss scale hooked on the model config as
megatron-bridge hooks them for NeMo RL.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import torch

from nemo_fp8_rl.config.temp_files import PREFIX, sweep
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.engines.nemo.cpu import cuda_shim, fp8_linear
from nemo_fp8_rl.engines.nemo.cpu import megatron_model as mm

PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def check_parallelism(meg: dict[str, Any]) -> None:
    """Refuse model parallelism: the CPU worker runs TP = PP = CP = EP = 1."""
    for key in PARALLEL_KEYS:
        if int(meg.get(key, 1) or 1) != 1:
            raise UsageError(
                f"policy.megatron_cfg.{key}={meg[key]}",
                "the CPU policy worker runs without model parallelism",
                "set it to 1",
            )


def init_distributed() -> None:
    """gloo process group (from NeMo RL's env, else one rank) and size-1 model parallelism."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
            torch.distributed.init_process_group("gloo")
        else:
            sweep("pg")  # what a killed worker left
            store = tempfile.mkdtemp(prefix=f"{PREFIX}pg-{os.getpid()}-")
            atexit.register(shutil.rmtree, store, True)  # the group lives as long as the process
            torch.distributed.init_process_group(
                "gloo", init_method=f"file://{store}/pg", world_size=1, rank=0
            )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 1)


def precision_bf16(policy_cfg: dict[str, Any]) -> bool:
    """Whether linear compute is BF16-emulated (`policy.precision`), else FP32."""
    precision = str(policy_cfg.get("precision", "bfloat16"))
    if precision not in ("bfloat16", "float32", "bf16", "fp32"):
        raise UsageError(
            f"policy.precision={precision!r}",
            "the CPU policy worker runs bfloat16 (emulated) or float32",
            "use one of those",
        )
    return precision in ("bfloat16", "bf16")


def build_model(policy_cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(hf config, TransformerConfig, GPTModel with the checkpoint's weights and emulation)."""
    model_dir = policy_cfg["model_name"]
    hf = mm.load_hf_config(model_dir)
    config = mm.transformer_config(hf)
    model = mm.build_gpt(hf, config)
    mm.load_into(model, mm.hf_to_megatron(mm.read_hf_state(model_dir), hf))
    fp8_linear.install(model, policy_cfg, bf16=precision_bf16(policy_cfg))
    fp8_linear.set_fp8_config(model, policy_cfg)
    return hf, config, model


def wrap_ddp(model: torch.nn.Module, config: Any, meg: dict[str, Any]) -> Any:
    """megatron-core's DDP around `model` (no overlap, average_in_collective off as in NeMo RL)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_cfg = meg.get("distributed_data_parallel_config") or {}
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        average_in_collective=False,
        use_distributed_optimizer=False,
        check_for_nan_in_grad=bool(ddp_cfg.get("check_for_nan_in_grad", True)),
    )
    with cuda_shim.cpu_devices():
        return DistributedDataParallel(config, ddp_config, model)


def hook_grads(ddp_model: Any, config: Any, optimizer: Any) -> None:
    """`finalize_model_grads` (the DP all-reduce) and the optimizer's loss scale on the config."""
    from megatron.core.distributed import finalize_model_grads

    config.finalize_model_grads_func = finalize_model_grads
    if optimizer is not None:
        config.grad_scale_func = optimizer.scale_loss
