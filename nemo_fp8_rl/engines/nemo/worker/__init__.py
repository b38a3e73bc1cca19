"""The NeMo RL engine's worker side: what NeMo RL's Ray workers and vLLM's processes import.

NeMo RL starts these classes from their class paths (`driver.worker_env`) in its own worker
environments, and Ray unpickles the loss there; the driver holds only strings and pickled data.
So nothing here imports the driver, the preflight, the CPU rehearsal or the run directory
(`runs`): an import contract in pyproject.toml holds it (`uv run lint-imports`). Besides NeMo RL's
worker modules and torch, they import only the package's pure stages (`loss`, `calibration`,
`fp8`, `refit`, `config`).

* NeMo RL's Megatron policy worker process: `policy_worker` (`ShadowMegatronPolicyWorker`,
  `TrainerFp8MegatronPolicyWorker`), its shadow-pass controls `shadow_controls` (`fp8_switch`,
  `schedule_hold`), the trainer-side FP8 refit stream `trainer_refit`, and the loss Ray
  unpickles there, `loss` with `observations`;
* NeMo RL's vLLM generation worker process: `generation_worker`
  (`TrainerFp8VllmGenerationWorker` and its async twin), which names
  `vllm_extension.TrainerFp8WorkerExtension` for vLLM's own worker processes, where the FP8
  pairs are checked and loaded as sent (`vllm_refit`);
* any generation worker actor, through Ray's `__ray_call__` from the driver's
  `served_guard`: `served_report`, the layers each serving process holds per precision.

Crossing the boundary, in: the loss object with the bounds in force (every `policy.train`), the
shadow log-probs in NeMo RL's batch (`loss.SHADOW_KEYS`), the refit metadata and tensors (NeMo
RL's ZeroMQ stream or collective broadcast); out: the loss metrics with the recorded calibration
statistics (`observations.PAYLOAD_KEY`), and exceptions Ray rebuilds in the driver
(`refit.errors.RefitMismatch`).
"""
