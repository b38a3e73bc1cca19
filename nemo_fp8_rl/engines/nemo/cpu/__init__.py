"""NeMo RL's real GRPO loop on one CPU machine: the parts that stand in for GPU-only ones.

NeMo RL's `grpo.setup`, `grpo_train`, `Policy`, `RayWorkerGroup`, `VllmGeneration`, data,
math environment, checkpointing and logger run as shipped. Stood in, each for a measured
reason (`stand_ins.CPU_LOOP_STAND_INS`):

* `policy_worker.CpuMegatronPolicyWorker`: NeMo RL's Megatron worker needs CUDA and NCCL at
  construction; this worker implements the methods `Policy` calls on its workers on real
  megatron-core (CPU, gloo, TP = PP = 1);
* `generation_worker.CpuGenerationWorker`: vLLM's CPU build cannot take NeMo RL's worker
  extension; this worker serves the same weights with the project's FP8 emulation behind
  NeMo RL's real `VllmGeneration`;
* `ipc`: CUDA IPC handles in NeMo RL's ZeroMQ refit stream become named shared-memory files;
* `cluster`: Ray declares logical GPUs, so NeMo RL's `RayVirtualCluster(use_gpus=True)`
  places its bundles as it does on a GPU node.
"""
