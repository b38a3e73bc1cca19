"""`nemo_fp8_rl.submit`: run a recipe as a Slurm job, and look after submitted jobs.

    nemo_fp8_rl.submit --recipe R [--account A --partition P --time T --container IMG --mounts M]
                       [--job-name N] [--nodes N] [--run-dir D] [--resume] [--template F]
                       [--seeds 1-3] [--dry-run] [--no-preflight] [key=value ...]
    nemo_fp8_rl.submit --eval RUN [--checkpoint last|best|step_N] [--suite S] [--data-dir D]
                       [--account A ...] [--dry-run]
    nemo_fp8_rl.submit status JOB
    nemo_fp8_rl.submit logs JOB [--ray]
    nemo_fp8_rl.submit cancel JOB

With `--seeds` the job is a Slurm job array, one task per seed (task id = seed): each task is a
complete job of its own (all its nodes, its own Ray cluster) training `<run dir>/seed-<k>` with
`grpo.seed=<k>`. Flags override the recipe's `slurm` section; trailing `dotted.key=value` overrides change the
recipe itself (checked by its schema) and are frozen into the copy the job trains with.
Before `sbatch`, the recipe's launch is rehearsed through NeMo RL's setup code on CPU (the
preflight of `nemo_fp8_rl.train --preflight`) where NeMo RL is importable; a failing recipe is
not submitted (exit 2). `--no-preflight` skips it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nemo_fp8_rl.cli.common import ArgumentParser, add_recipe_args, run_main
from nemo_fp8_rl.config import RecipeError, load_recipe
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.runs import rundir
from nemo_fp8_rl.runs.seeds import SeedSpecError
from nemo_fp8_rl.slurm import (
    JobSpecError,
    SlurmError,
    array_tasks,
    build_job_spec,
    cancel,
    job_status,
    log_files,
    render_sbatch,
    submit,
    write_job_files,
)
from nemo_fp8_rl.slurm.spec import split_mounts

_JOB_COMMANDS = ("status", "logs", "cancel")


def _submit_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="nemo_fp8_rl.submit",
        description="Submit a recipe as a Slurm job (Ray head + workers, then training). "
        "Also: nemo_fp8_rl.submit status|logs|cancel JOB.",
    )
    add_recipe_args(p)
    p.add_argument("--account", help="Slurm account (overrides slurm.account)")
    p.add_argument("--partition", help="Slurm partition (overrides slurm.partition)")
    p.add_argument("--time", help="time limit, e.g. 04:00:00 (overrides slurm.time)")
    p.add_argument("--container", help="container image for pyxis (overrides slurm.container)")
    p.add_argument("--mounts", help="comma-separated SRC:DST[:ro] list (overrides slurm.mounts)")
    p.add_argument("--job-name", help="job name (default: the recipe name)")
    p.add_argument("--nodes", type=int, help="nodes to allocate (default: cluster.num_nodes)")
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/<recipe name>)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the run dir's latest checkpoint"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="start over a run of this recipe in the run dir"
    )
    p.add_argument("--template", type=Path, help="sbatch template (default: slurm/ray-job.sbatch)")
    p.add_argument(
        "--seeds",
        help="submit a job array, one task per seed, e.g. 1-3 or 1,2,5 (runs in <run dir>/seed-<k>)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.add_argument(
        "--no-preflight",
        action="store_true",
        help="submit without rehearsing the launch through NeMo RL's setup code first",
    )
    return p


def _eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nemo_fp8_rl.submit --eval",
        description="Evaluate a run as a Slurm job (one node; nemo_fp8_rl.eval on a Ray cluster).",
    )
    p.add_argument("--eval", type=Path, required=True, metavar="RUN", help="run directory")
    p.add_argument("--checkpoint", default="last", help="last (default), best or step_N")
    p.add_argument("--suite", default=None, help="benchmark suite (default: math8 on GPU runs)")
    p.add_argument("--data-dir", default=None, help="JSONL files for benchmarks NeMo RL lacks")
    for flag in ("account", "partition", "time", "container", "mounts", "job-name"):
        p.add_argument(f"--{flag}")
    p.add_argument("--template", type=Path, help="sbatch template (default: slurm/ray-job.sbatch)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    return p


def _job_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The Slurm settings every job takes from the command line (training and evaluation)."""
    return {
        "account": args.account,
        "partition": args.partition,
        "time": args.time,
        "container": args.container,
        "mounts": split_mounts(args.mounts) if args.mounts else None,
        "job_name": args.job_name,
    }


def run_submit_eval(args: argparse.Namespace) -> int:
    """Render (and submit) a one-node job that runs `nemo_fp8_rl.eval` on the run."""
    from types import SimpleNamespace

    from nemo_fp8_rl.evals.request import check_request

    run_dir = args.eval.absolute()
    data_dir = Path(args.data_dir).absolute() if args.data_dir else None
    # the checks `nemo_fp8_rl.eval` makes, before a job is written or submitted (or dry-run)
    config = check_request(run_dir, args.checkpoint, args.suite, data_dir).config
    config["cluster"] = {**config["cluster"], "num_nodes": 1}  # evaluation runs on one node
    job = SimpleNamespace(config=config, name=f"eval-{run_dir.name}", run_dir=run_dir)
    flags = {
        **_job_flags(args),
        "eval_checkpoint": args.checkpoint,
        "eval_suite": args.suite,
        "eval_data_dir": str(data_dir) if data_dir else None,
    }
    spec = build_job_spec(job, run_dir / "recipe.yaml", flags=flags)
    script = render_sbatch(spec, args.template)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    spec.log_root.mkdir(parents=True, exist_ok=True)
    script_file = spec.log_root / f"{job.name}.sbatch"
    script_file.write_text(script)
    job_id = submit(script_file)
    print(f"Submitted job {job_id}: evaluation of {run_dir} ({args.checkpoint})")
    print(f"Output: {spec.log_root}/slurm-{job_id}.out; results: {run_dir}/eval/")
    return 0


def _job_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="nemo_fp8_rl.submit", description="Look after a Slurm job.")
    p.add_argument("command", choices=_JOB_COMMANDS)
    p.add_argument("job_id", help="the job id printed at submission")
    p.add_argument("--ray", action="store_true", help="logs: also print the Ray head/worker logs")
    p.add_argument("--wait", type=float, default=120.0, help="cancel: seconds to wait for the end")
    return p


def preflight_gate(recipe, skip: bool) -> int | None:
    """Run the preflight before sbatch; an exit code if the recipe must not be submitted.

    Skipped (and said so on stderr) with --no-preflight or where NeMo RL is not importable.
    """
    if recipe.config["cluster"]["gpus_per_node"] == 0:
        return None  # a CPU recipe runs the embedded engine: nothing of NeMo RL to rehearse
    if skip:
        print("preflight skipped (--no-preflight): the launch was not rehearsed", file=sys.stderr)
        return None
    from nemo_fp8_rl.engines.nemo.compat import available

    ok, why = available()
    if not ok:
        print(f"preflight skipped: NeMo RL is not importable here ({why})", file=sys.stderr)
        return None
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    result = preflight(recipe)
    print(result.report(), file=sys.stderr)
    if not result.ok:
        print(
            "error: not submitted: the preflight failed (fix the recipe, or --no-preflight)",
            file=sys.stderr,
        )
        return 2
    return None


def run_submit(args: argparse.Namespace) -> int:
    """Load the recipe, render the script; print it (--dry-run) or write the files and sbatch."""
    recipe = load_recipe(args.recipe, args.overrides, run_dir=args.run_dir)
    seeds = _check_seeds(recipe, args) if args.seeds is not None else None
    flags = {
        **_job_flags(args),
        "nodes": args.nodes,
        "resume": args.resume or None,
        "seeds": seeds,
        "overwrite": args.overwrite or None,
    }
    log_root = Path(recipe.run_dir).absolute() / "slurm"
    spec = build_job_spec(recipe, log_root / f"{recipe.name}.yaml", flags=flags)
    script = render_sbatch(spec, args.template)
    if spec.nodes > recipe.config["cluster"]["num_nodes"]:  # a CPU recipe (GPU: refused)
        print(
            f"note: --nodes {spec.nodes}: the job starts a Ray cluster of {spec.nodes} nodes; the "
            "embedded engine (cluster.num_nodes=1) puts its trainer and rollout actors wherever "
            "Ray has room on them",
            file=sys.stderr,
        )
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    if not spec.is_array:  # array tasks' run dirs were checked per seed
        rundir.check_owner(
            spec.run_dir, recipe.config, resume=args.resume, overwrite=args.overwrite
        )
    refused = preflight_gate(recipe, skip=args.no_preflight)
    if refused is not None:
        return refused
    _, script_file = write_job_files(recipe, script, spec.log_root)
    job_id = submit(script_file)
    print(f"Submitted job {job_id}")
    print(f"Run directory: {spec.run_dir}")
    print(f"Script: {script_file}")
    if spec.is_array:
        print(f"Seeds: {', '.join(map(str, spec.seeds))} (array tasks {job_id}_<seed>)")
        print(
            f"Output: {spec.log_root}/slurm-{job_id}_<seed>.out, runs in {spec.run_dir}/seed-<seed>"
        )
    else:
        print(f"Output: {spec.log_root}/slurm-{job_id}.out")
    return 0


def _check_seeds(recipe, args: argparse.Namespace) -> list[int]:
    """Parse --seeds and check every seed's recipe and run directory before anything is written."""
    from nemo_fp8_rl.runs.rundir import check_owner
    from nemo_fp8_rl.runs.seeds import SEED_KEY, check_overrides, parse_seeds, seed_run_dir

    seeds = parse_seeds(args.seeds)
    check_overrides(args.overrides)
    for seed in seeds:
        run_dir = seed_run_dir(recipe.run_dir, seed)
        seeded = load_recipe(recipe.path, [*args.overrides, f"{SEED_KEY}={seed}"], run_dir=run_dir)
        if not args.resume:
            check_owner(run_dir, seeded.config, overwrite=args.overwrite)
    return seeds


def run_job_command(args: argparse.Namespace) -> int:
    """status / logs / cancel for one job id."""
    if args.command == "status":
        status = job_status(args.job_id)
        print(
            f"job {status.job_id}: {status.state}"
            + (f" (exit {status.exit_code})" if status.exit_code else "")
        )
        for task in array_tasks(args.job_id) if "_" not in args.job_id else []:
            print(
                f"  task {task.job_id}: {task.state}"
                + (f" (exit {task.exit_code})" if task.exit_code else "")
            )
        return 0 if status.state != "UNKNOWN" else 1
    if args.command == "cancel":
        status = cancel(args.job_id, wait_s=args.wait)
        print(f"job {status.job_id}: {status.state}")
        return 0 if status.finished else 1
    files = log_files(args.job_id)
    if not files:
        print(f"no log files found for job {args.job_id}", file=sys.stderr)
        return 1
    for path in files if args.ray else files[:1]:
        if len(files) > 1 and args.ray:
            print(f"==> {path} <==")
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: `submit` by default, or `status|logs|cancel JOB` when the first word says so."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in _JOB_COMMANDS:
            return run_job_command(_job_parser().parse_args(argv))
        if any(a == "--eval" or a.startswith("--eval=") for a in argv):
            return run_submit_eval(_eval_parser().parse_args(argv))
        return run_submit(_submit_parser().parse_intermixed_args(argv))
    except (RecipeError, JobSpecError, SeedSpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except UserError as err:  # RunDirError, a bad --eval run, checkpoint, suite or data dir
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except (SlurmError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


entry = run_main(main)

if __name__ == "__main__":
    entry()
