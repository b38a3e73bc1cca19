"""Slurm submission: an sbatch script rendered from a recipe (Ray head on the first node, workers
on the others, then `nemo_fp8_rl.train`), and submit / status / logs / cancel."""

from nemo_fp8_rl.slurm.jobs import (
    JobStatus,
    SlurmError,
    array_tasks,
    cancel,
    frozen_recipe_text,
    job_status,
    log_files,
    submit,
    wait_for_state,
    write_job_files,
)
from nemo_fp8_rl.slurm.render import default_template, render_sbatch
from nemo_fp8_rl.slurm.spec import JobSpec, JobSpecError, build_job_spec

__all__ = [
    "JobSpec",
    "JobSpecError",
    "JobStatus",
    "SlurmError",
    "array_tasks",
    "build_job_spec",
    "cancel",
    "default_template",
    "frozen_recipe_text",
    "job_status",
    "log_files",
    "render_sbatch",
    "submit",
    "wait_for_state",
    "write_job_files",
]
