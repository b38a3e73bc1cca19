"""NeMo RL's real GRPO loop on one CPU machine: the parts that stand in for GPU-only ones.

NeMo RL's `grpo.setup`, `grpo_train`, `Policy`, `RayWorkerGroup`, `VllmGeneration`, data,
math environment, checkpointing and logger run as shipped. Stood in, each for a measured
reason (`stand_ins.CPU_LOOP_STAND_INS` lists every one; the main ones):

* `policy_worker.CpuMegatronPolicyWorker`: NeMo RL's Megatron worker needs CUDA and NCCL at
  construction; this worker implements the methods `Policy` calls on its workers on real
  megatron-core (CPU, gloo, TP = PP = 1);
* `vllm_worker.CpuVllmGenerationWorker`: NeMo RL's own vLLM worker on vLLM's CPU build, with
  its four GPU-only points answered; where real vLLM cannot run (no vLLM installed, block FP8
  without AMX: `vllm_choice`), `generation_worker.CpuGenerationWorker` serves the same weights
  with the project's FP8 emulation behind NeMo RL's real `VllmGeneration`;
* `ipc`: CUDA IPC handles in NeMo RL's ZeroMQ refit stream become named shared-memory files;
* `cluster`: Ray declares logical GPUs, so NeMo RL's `RayVirtualCluster(use_gpus=True)`
  places its bundles as it does on a GPU node.
"""
