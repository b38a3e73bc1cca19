"""The NeMo RL engine's driver side: what runs in `nemo_fp8_rl.train`'s process.

Imported by the driver only, the process that calls NeMo RL's `grpo.setup` and `grpo_train`; no
Ray worker imports this folder (the worker side's import contract in pyproject.toml holds it).

* `runner`: `run(recipe)`, NeMo RL's `run_grpo.py` sequence with the project's substitutions;
  `platform`: what differs between a GPU cluster and the CPU loop (`cpu.loop`), asked of one object;
* `handoff`: the recipe as NeMo RL's master config (`nemo_rl_config.yaml`, checked by `MasterConfig`);
  `compat`: which NeMo RL is installed and whether the engine can drive it; `mx_support`: MXFP8
  rollout settings the installed NeMo RL would not run as written (read from its source);
* `worker_env`: the class paths of the project's workers, the interpreter NeMo RL starts each
  with, and the PYTHONPATH entry through which Ray workers import this package;
  `refit_workers`: which workers `refit.quantize_on` needs;
* `shadow`: `ShadowPolicy` around NeMo RL's `Policy` (BF16 shadow passes, the calibrator's
  update); `train_results`: one `policy.train` result from a split step; `checkpoint`: the
  calibrator's state in NeMo RL's checkpoints;
* `async_loop`: `grpo_train` or `async_grpo_train`; `metrics_log`: `metrics.jsonl` beside NeMo
  RL's logger; `worker_faults`: a worker's death or exception as one located error.

What crosses to the workers: class paths as strings (`worker_env`; NeMo RL imports the classes in
its worker environments, the driver never does), the loss object (`worker.loss`, pickled by Ray
into every policy worker on each `policy.train`, carrying the bounds in force), shadow
log-probs as `[B, S]` tensors in NeMo RL's batch, and named method calls (`set_fp8_compute`,
`hold_lr_schedule`). What comes back: the loss metrics carrying the calibration statistics
(`worker.observations`), and worker exceptions rebuilt by Ray. The driver imports the worker
side's `loss` and `observations` for those objects; they need neither NeMo RL nor a GPU.
"""
