"""Overrides that shrink a tiny recipe to a two-step run with a 5-step fixed warm-up, for tests
that need a real run but not a learning one (seeds launcher, Slurm job array)."""

TWO_STEPS = [
    "grpo.max_num_steps=2",
    "grpo.val_at_start=false",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "local.warmup.steps=5",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=16",
]
