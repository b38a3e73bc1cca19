"""NeMo RL's real GRPO loop on one CPU machine: the parts that stand in for GPU-only ones.

NeMo RL's `grpo.setup`, `grpo_train`, `Policy`, `RayWorkerGroup`, `VllmGeneration`, data,
math environment, checkpointing and logger run as shipped. Stood in, each for a measured
reason (`stand_ins.CPU_LOOP_STAND_INS` lists every one; the main ones):

* `policy_worker.CpuMegatronPolicyWorker`: NeMo RL's Megatron worker needs CUDA and NCCL at
  construction; this worker implements the methods `Policy` calls on its workers on real
  megatron-core (CPU, gloo, TP = PP = 1);
* `vllm_worker.CpuVllmGenerationWorker`: NeMo RL's own vLLM worker on vLLM's CPU build, with
  its four GPU-only points answered and the refit into vLLM's CPU build made to work
  (`vllm_cpu_weights`); where real vLLM cannot run (no vLLM installed, block FP8
  without AMX: `vllm_choice`), `generation_worker.CpuGenerationWorker` serves the same weights
  with the project's FP8 emulation behind NeMo RL's real `VllmGeneration`;
* `ipc`: CUDA IPC handles in NeMo RL's ZeroMQ refit stream become named shared-memory files;
* `cluster`: Ray declares logical GPUs, so NeMo RL's `RayVirtualCluster(use_gpus=True)`
  places its bundles as it does on a GPU node.

Which process imports what:

* the driver (`nemo_fp8_rl.train`): `loop` (`CpuLoop`, the CPU answers of the runner's platform
  seam, `driver.platform`), `cluster`, `worker_choice` (which imports the generation workers'
  modules for their class paths only) and `stand_ins` (the table docs/cluster.md holds);
* the policy worker's Ray actor: `policy_worker` and what it builds from (`worker_setup`,
  `megatron_model`, `fp8_linear`, `optim`, `steps`, `train_loop`, `cuda_shim`, `checkpoint_io`,
  `kv_calibration`), with the worker side's `shadow_controls` and `trainer_refit`;
* the generation worker's Ray actor: `generation_worker`, `async_generation_worker`,
  `generation_io`, `served_model`, `vllm_names`, `fp8_setup`, `extension`, `device` (the
  stand-in), or `vllm_worker` with, inside vLLM's worker, `vllm_extension` and
  `vllm_cpu_weights` (real vLLM);
* both actors: `ipc` and `collective`, the two ends of the refit.

What crosses: the workers' class paths (`loop.WORKERS`, registered to run in this interpreter),
the loss and its statistics as on a GPU (`worker`), and the refit's tensors, as named
shared-memory files inside NeMo RL's ZeroMQ stream (`ipc`) or a gloo broadcast (`collective`).
The worker modules import nothing of the driver (the same import contract as `worker`).
"""
