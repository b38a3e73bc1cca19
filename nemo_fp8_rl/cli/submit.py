"""`nemo_fp8_rl.submit`: run a recipe as a Slurm job, and look after submitted jobs (`submit_jobs`).

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
`grpo.seed=<k>`. Seeds are planned as `train --seeds` plans them (`nemo_fp8_rl.runs.seed_plan`):
a seed whose run finished before is kept (left out of the array; all kept: nothing submitted),
and with `--resume` only the tasks of seeds stopped part-way get `--resume`. Flags override the recipe's `slurm` section; trailing `dotted.key=value` overrides change the
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

from nemo_fp8_rl.cli.common import (
    SEEDS_SYNTAX,
    ArgumentParser,
    add_gpu_arg,
    add_recipe_args,
    gpu_overrides,
    run_main,
)
from nemo_fp8_rl.cli.submit_jobs import JOB_COMMANDS, job_parser, run_job_command
from nemo_fp8_rl.config import RecipeError
from nemo_fp8_rl.config.nemo_import import load_recipe_or_import
from nemo_fp8_rl.config.safe_files import check_folder, write_atomic
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.engines.choose import EngineUnavailable
from nemo_fp8_rl.runs import rundir
from nemo_fp8_rl.slurm import build_job_spec, render_sbatch, submit, write_job_files
from nemo_fp8_rl.slurm.spec import split_mounts

DESCRIPTION = """\
Run a recipe as a Slurm job: a Ray head and workers on the allocated nodes, then training.
Flags override the recipe's slurm section; trailing overrides change the recipe itself (checked
by its schema) and are frozen into the copy the job trains with. With --seeds the job is a
Slurm job array, one task per seed (task id = seed), each training <run dir>/seed-<k>;
seeds are planned as train --seeds plans them (finished seeds kept out of the array, --resume
only for seeds stopped part-way). Before sbatch, a GPU recipe's launch is rehearsed through
NeMo RL's setup code on CPU where NeMo RL is installed; a recipe that fails the rehearsal is
not submitted (exit 2).

With --eval RUN the job evaluates a finished run instead (one node, nemo_fp8_rl.eval).

job commands:
  status JOB             the job's state, and each array task's
  logs JOB [--ray]       the job's output (--ray: also the Ray head and worker logs)
  cancel JOB [--wait S]  cancel the job, then wait up to S seconds (default 120) for it to end"""
USAGE = """%(prog)s --recipe R [options] [key=value|~key ...]
       %(prog)s --eval RUN [--checkpoint C] [--suite S] [--data-dir D] [Slurm options]
       %(prog)s status|logs|cancel JOB [--ray] [--wait S]"""
EXAMPLES = [
    "nemo_fp8_rl.submit --recipe qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8 \\\n"
    "      --account A --partition batch --time 04:00:00 --seeds 1-3",
]
EVAL_FLAGS = ("--checkpoint", "--suite", "--data-dir")


def _add_slurm_args(p: argparse._ActionsContainer) -> None:
    """The Slurm settings both kinds of job take (they override the recipe's slurm section)."""
    p.add_argument("--account", help="Slurm account (overrides slurm.account)")
    p.add_argument("--partition", help="Slurm partition (overrides slurm.partition)")
    p.add_argument("--time", help="time limit, e.g. 04:00:00 (overrides slurm.time)")
    p.add_argument("--container", help="container image for pyxis (overrides slurm.container)")
    p.add_argument("--mounts", help="comma-separated SRC:DST[:ro] list (overrides slurm.mounts)")
    p.add_argument("--job-name", help="job name (default: the recipe name)")
    p.add_argument("--template", type=Path, help="sbatch template (default: slurm/ray-job.sbatch)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")


def _add_eval_args(p: argparse._ActionsContainer, checkpoint: str | None) -> None:
    p.add_argument("--eval", type=Path, metavar="RUN", help="evaluate this run directory")
    p.add_argument(
        "--checkpoint", default=checkpoint, help="with --eval: last (default), best or step_N"
    )
    p.add_argument(
        "--suite", default=None, help="with --eval: benchmark suite (default: math8 on GPU runs)"
    )
    p.add_argument(
        "--data-dir", default=None, help="with --eval: JSONL files for benchmarks NeMo RL lacks"
    )


def _submit_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="nemo_fp8_rl.submit", usage=USAGE, description=DESCRIPTION, examples=EXAMPLES
    )
    add_recipe_args(p)
    add_gpu_arg(p)
    p.add_argument("--nodes", type=int, help="nodes to allocate (default: cluster.num_nodes)")
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/<recipe name>)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the run dir's latest checkpoint"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="start over a run of this recipe in the run dir"
    )
    p.add_argument(
        "--seeds",
        metavar="SEEDS",
        help=f"a job array, one task per seed, in <run dir>/seed-<k>; seeds as {SEEDS_SYNTAX}",
    )
    p.add_argument(
        "--no-preflight",
        action="store_true",
        help="submit without rehearsing the launch through NeMo RL's setup code first",
    )
    _add_slurm_args(p.add_argument_group("Slurm settings (training and evaluation jobs)"))
    _add_eval_args(p.add_argument_group("evaluation job (instead of --recipe)"), None)
    return p


def _eval_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="nemo_fp8_rl.submit",
        usage="%(prog)s --eval RUN [--checkpoint C] [--suite S] [--data-dir D] [Slurm options]",
        description="Evaluate a run as a Slurm job (one node; nemo_fp8_rl.eval on a Ray cluster).",
        examples=["nemo_fp8_rl.submit --eval runs/grpo-qwen3-8b-base-1n8g-fp8 --checkpoint best"],
    )
    _add_eval_args(p, "last")
    _add_slurm_args(p)
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
    write_atomic(script_file, script, mode=0o755)
    job_id = submit(script_file)
    print(f"Submitted job {job_id}: evaluation of {run_dir} ({args.checkpoint})")
    print(f"Output: {spec.log_root}/slurm-{job_id}.out; results: {run_dir}/eval/")
    return 0


def preflight_gate(recipe, skip: bool) -> int | None:
    """Run the preflight before sbatch; an exit code if the recipe must not be submitted.

    Skipped (and said so on stderr) with --no-preflight or where NeMo RL is not importable.
    """
    if recipe.on_cpu:
        return None  # a CPU recipe runs the embedded engine: nothing of NeMo RL to rehearse
    if skip:
        print("preflight skipped (--no-preflight): the launch was not rehearsed", file=sys.stderr)
        return None
    from nemo_fp8_rl.engines.nemo.driver.compat import available

    ok, why = available()
    if not ok:
        print(f"preflight skipped: NeMo RL is not importable here ({why})", file=sys.stderr)
        return guard_gate(recipe)
    from nemo_fp8_rl.engines.nemo.preflight import preflight

    result = preflight(recipe)
    print(result.report(), file=sys.stderr)
    if not result.ok:
        raise UsageError(
            recipe.name,
            f"not submitted: the preflight found {result.problem_count} problem(s), listed above",
            "fix each in the recipe (or with an override), or submit without the rehearsal "
            "with --no-preflight",
        )
    return None


def _gate_recipe(recipe, partition: str | None):
    """The recipe as the checks see it: `--partition` names the workers' partition (whose GRES
    tell their GPU type when neither --gpu nor slurm.gpu does)."""
    if not partition:
        return recipe
    import copy
    import dataclasses

    config = copy.deepcopy(recipe.config)
    config.setdefault("slurm", {})["partition"] = partition
    return dataclasses.replace(recipe, config=config)


def guard_gate(recipe) -> None:
    """The guard rails alone (no NeMo RL here: its tree's checks say they did not run)."""
    from nemo_fp8_rl.cli.guard_gate import guard_gate as gate

    gate(recipe, "not submitted", ", or submit without the checks with --no-preflight")


def run_submit(args: argparse.Namespace) -> int:
    """Load the recipe, render the script; print it (--dry-run) or write the files and sbatch."""
    for flag in EVAL_FLAGS:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise UsageError(
                flag,
                "goes with --eval RUN (a job that evaluates a run), not with --recipe",
                f"add --eval RUN to evaluate a run, or drop {flag}",
            )
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume", "continues a run and --overwrite starts it over", "give one of them"
        )
    args.overrides = [*args.overrides, *gpu_overrides(args)]
    recipe = load_recipe_or_import(args.recipe, args.overrides, run_dir=args.run_dir)
    flags = {
        **_job_flags(args),
        "nodes": args.nodes,
        "resume": args.resume or None,
        "overwrite": args.overwrite or None,
    }
    check_job_engine(recipe, args)
    if args.seeds is not None:
        array = _array_flags(recipe, args)
        if array is None:
            return 0
        flags.update(array)
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
    job_python = check_job_python(recipe, spec)
    if args.dry_run:  # refused as the real submission would be, before the script is shown
        refused = preflight_gate(_gate_recipe(recipe, args.partition), skip=args.no_preflight)
        if refused is not None:
            return refused
        sys.stdout.write(script)
        if job_python is not None:
            print(f"note: a real submit from here is refused: {job_python}", file=sys.stderr)
        return 0
    if not spec.is_array:  # array tasks' run dirs were checked per seed
        rundir.check_owner(
            spec.run_dir, recipe.config, resume=args.resume, overwrite=args.overwrite
        )
    refused = preflight_gate(_gate_recipe(recipe, args.partition), skip=args.no_preflight)
    if refused is not None:
        return refused
    if job_python is not None:
        raise EngineUnavailable(
            f"{sys.executable} (the job's Python)",
            job_python,
            "submit from NeMo RL's environment (its Python, e.g. `python -m nemo_fp8_rl.submit` "
            "in NeMo RL's checkout set up with uv, PYTHONPATH holding this repository), or run "
            "the job in NVIDIA's nemo-rl container (--container IMAGE) or give a "
            "slurm.setup_command that activates NeMo RL's environment",
        )
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


def check_job_python(recipe, spec) -> str | None:
    """Why the job's Python cannot run the job's engine (None: it can, or the job brings its
    own environment). Without a container or setup command the job runs this interpreter
    (`build_job_spec` puts its folder first on PATH): a GPU recipe's job needs NeMo RL there,
    else it would hold its GPUs and exit 3 (`engines.nemo.available`, the check `train` makes)."""
    if recipe.config["cluster"]["gpus_per_node"] == 0 or spec.container or spec.setup_command:
        return None
    from nemo_fp8_rl.engines import nemo

    ok, why = nemo.available()
    if ok:
        return None
    reason = why.partition(". ")[0].rstrip(".")  # its first sentence: what is missing
    return (
        f"the job runs {recipe.name} on NeMo RL with this Python ({reason}), so it would hold "
        f"{spec.nodes * spec.gpus_per_node} GPU(s) and exit 3"
    )


def check_job_engine(recipe, args: argparse.Namespace) -> None:
    """What the job's `train` would refuse on the node, refused here (dry run included): the
    engine the job runs (the embedded one for a CPU recipe, NeMo RL for a GPU recipe) and its
    rules, and hand-set output folders (`engines.choose.check_engine`; this machine's GPU is
    not the job's). A job array cannot give each task its own hand-set folder: refused."""
    from nemo_fp8_rl.config.recipe import hand_set_paths
    from nemo_fp8_rl.engines.choose import check_engine

    engine = "local" if recipe.on_cpu else "nemo"
    check_engine(
        recipe,
        engine,
        here=False,
        resume=args.resume,
        overwrite=args.overwrite,
        outputs=args.seeds is None,
    )
    if args.seeds is not None:
        issues = hand_set_paths(
            recipe,
            "a job array trains every seed with the same recipe file, so the seeds would share "
            "this folder",
            "remove it (each seed then writes under <run dir>/seed-<k>), or submit each seed "
            "on its own with grpo.seed=<k> and its own folder",
        )
        if issues:
            raise RecipeError(recipe.name, issues)


def _plan_seeds(recipe, args: argparse.Namespace) -> dict[int, str]:
    """Parse --seeds, check the group folder and every seed's recipe and run directory, and
    print the plan (`train --seeds`'s line; on stderr with --dry-run, whose stdout is the script).

    Returns each seed's action (`nemo_fp8_rl.runs.seed_plan`): start, resume, overwrite, or keep
    for a seed whose run finished before (left out of the array).
    """
    from nemo_fp8_rl.runs.seed_plan import check_group, plan_line, seed_actions
    from nemo_fp8_rl.runs.seeds import check_overrides, parse_seeds

    seeds = parse_seeds(args.seeds)
    check_overrides(args.overrides)
    check_group(recipe.run_dir)
    actions = seed_actions(
        recipe, seeds, args.overrides, resume=args.resume, overwrite=args.overwrite
    )
    line = plan_line(recipe.run_dir, actions, "in one Slurm job array")
    print(line, file=sys.stderr if args.dry_run else sys.stdout)
    return actions


def _array_flags(recipe, args: argparse.Namespace) -> dict[str, Any] | None:
    """The job array's `seeds` and `resume_seeds` flags from the plan; None (said on stdout)
    when every seed finished before and there is nothing to submit."""
    from nemo_fp8_rl.runs.seed_plan import seed_keys

    actions = _plan_seeds(recipe, args)
    if all(action == "keep" for action in actions.values()):
        print(f"nothing to submit: every seed of {Path(recipe.run_dir).name} finished before")
        return None
    return {
        "resume": None,  # an array resumes per seed: the tasks in resume_seeds
        "seeds": [s for s, a in actions.items() if a != "keep"],
        "resume_seeds": [s for s, a in actions.items() if a == "resume"],
        "seed_keys": seed_keys(recipe, args.overrides),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: `submit` by default, or `status|logs|cancel JOB` when the first word says so.

    Every failure is raised to `invoke`, which prints its error line and exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in JOB_COMMANDS:
        return run_job_command(job_parser().parse_args(argv))
    if any(a == "--eval" or a.startswith("--eval=") for a in argv):
        return run_submit_eval(_eval_parser().parse_args(argv))
    args = _submit_parser().parse_intermixed_args(argv)
    if args.run_dir is not None:
        check_folder(args.run_dir, "run folder")  # a link loop names no folder
    return run_submit(args)


entry = run_main(main)

if __name__ == "__main__":
    entry()
