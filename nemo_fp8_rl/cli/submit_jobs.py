"""`nemo_fp8_rl.submit status|logs|cancel JOB`: look after a submitted Slurm job.

Every outcome that is not what was asked (a job Slurm has no record of, no log file, a job still
running after `cancel`'s wait) is an error line with a fix and exit code 1.
"""

from __future__ import annotations

import argparse
import sys

from nemo_fp8_rl.cli.common import ArgumentParser, wait_seconds
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.slurm import array_tasks, cancel, job_status, log_files

JOB_COMMANDS = ("status", "logs", "cancel")
DESCRIPTION = """\
Look after a submitted Slurm job:
  status JOB             the job's state, and each array task's
  logs JOB [--ray]       the job's output (--ray: also the Ray head and worker logs)
  cancel JOB [--wait S]  cancel the job, then wait up to S seconds for it to end"""


def job_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="nemo_fp8_rl.submit",
        usage="%(prog)s status|logs|cancel JOB [--ray] [--wait S]",
        description=DESCRIPTION,
        examples=["nemo_fp8_rl.submit logs 4242 --ray"],
    )
    p.add_argument("command", choices=JOB_COMMANDS, help="status, logs or cancel")
    p.add_argument(
        "job_id", metavar="JOB", help="the job id sbatch printed (an array task: 4242_3)"
    )
    p.add_argument("--ray", action="store_true", help="logs: also print the Ray head/worker logs")
    p.add_argument(
        "--wait",
        type=wait_seconds,
        default=120.0,
        metavar="S",
        help="cancel: seconds to wait for the job to end (default 120)",
    )
    return p


def _state(status) -> str:
    return status.state + (f" (exit {status.exit_code})" if status.exit_code else "")


def run_job_command(args: argparse.Namespace) -> int:
    """status / logs / cancel for one job id."""
    job = f"job {args.job_id}"
    if args.command == "status":
        status = job_status(args.job_id)
        if status.state == "UNKNOWN":
            raise UserError(
                job,
                "Slurm has no record of it (scontrol, squeue and sacct know no such job)",
                "check the id sbatch printed; a job that ended long ago is known only where "
                "Slurm keeps accounting (sacct)",
            )
        print(f"job {status.job_id}: {_state(status)}")
        for task in array_tasks(args.job_id) if "_" not in args.job_id else []:
            print(f"  task {task.job_id}: {_state(task)}")
        return 0
    if args.command == "cancel":
        status = cancel(args.job_id, wait_s=args.wait)
        print(f"job {status.job_id}: {status.state}")
        if not status.finished:
            raise UserError(
                job,
                f"still {status.state} {args.wait:g} s after scancel",
                f"check again with nemo_fp8_rl.submit status {args.job_id}, or give --wait more "
                "seconds",
            )
        return 0
    files = log_files(args.job_id)
    if not files:
        raise UserError(
            job,
            f"no log files found (Slurm names no output file for it, and there is no "
            f"runs/*/slurm/slurm-{args.job_id}.out here)",
            "run it from the folder you submitted from, or look in <run dir>/slurm/",
        )
    for path in files if args.ray else files[:1]:
        if len(files) > 1 and args.ray:
            print(f"==> {path} <==")
        sys.stdout.write(path.read_text(errors="replace"))
    return 0
