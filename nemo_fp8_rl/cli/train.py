"""`nemo_fp8_rl.train --recipe R [--engine auto|local|nemo] [--dry-run] [--preflight] [--resume | --overwrite] [key=value ...]`.

With `--seeds 1-3 [--parallel N]` the recipe trains once per seed, each in `<run dir>/seed-<k>`
(see `nemo_fp8_rl.cli.train_seeds`). `--help` shows `DESCRIPTION` (plain text, for a terminal).

`auto` runs the embedded CPU engine for `cluster.gpus_per_node: 0` and NeMo RL otherwise.
`--preflight` rehearses a GPU recipe's launch through NeMo RL's real setup code on CPU (exit 2
with every problem located if it fails); see `engines/nemo/preflight/`.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
from pathlib import Path

from nemo_fp8_rl.cli.common import (
    ArgumentParser,
    add_gpu_arg,
    add_recipe_args,
    gpu_overrides,
    run_main,
)
from nemo_fp8_rl.cli.train_seeds import add_seed_args, main_seeds
from nemo_fp8_rl.config.nemo_import import load_recipe_or_import
from nemo_fp8_rl.config.safe_files import check_folder
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.engines.choose import (
    EngineUnavailable,
    check_engine,
    choose_engine,
    require_nemo_rl,
)
from nemo_fp8_rl.runs.endpoints import probe_loggers
from nemo_fp8_rl.runs.seeds import check_overrides as check_seed_overrides
from nemo_fp8_rl.runs.seeds import parse_seeds, raise_on_sigterm
from nemo_fp8_rl.runs.summary import print_summary

DESCRIPTION = """\
Train a recipe. CPU recipes (cluster.gpus_per_node: 0, those under recipes/tiny/) run on the
embedded engine; GPU recipes run on NeMo RL, which must be installed here (use
nemo_fp8_rl.submit for a Slurm cluster). Outputs go to the run dir: runs/<recipe name> unless
--run-dir says otherwise. With --seeds the recipe trains once per seed, in <run dir>/seed-<k>.

--preflight rehearses a GPU recipe's launch through NeMo RL's own setup code on CPU and starts
nothing: every problem it finds is listed with the NeMo RL file and line that needs the key."""
EXAMPLES = [
    "nemo_fp8_rl.train --recipe tiny/grpo-tiny-qwen3-cpu-fp8 grpo.max_num_steps=20",
    "nemo_fp8_rl.train --recipe tiny/grpo-tiny-qwen3-cpu-bf16 --seeds 1-3 --parallel 2",
]


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="nemo_fp8_rl.train", description=DESCRIPTION, examples=EXAMPLES)
    add_recipe_args(parser)
    parser.add_argument(
        "--engine",
        choices=("auto", "local", "nemo"),
        default="auto",
        help="auto (default): local for CPU recipes, nemo for GPU recipes",
    )
    parser.add_argument("--run-dir", type=Path, help="output folder (default: runs/<recipe name>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the run dir's latest checkpoint"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="start over a run of this recipe in the run dir"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved recipe and the engine, run nothing",
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="rehearse the launch through NeMo RL's setup code on CPU, start nothing",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of a progress bar"
    )
    add_gpu_arg(parser)
    add_seed_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    args.overrides = [*args.overrides, *gpu_overrides(args)]
    if args.resume and args.overwrite:
        parser.error("--resume continues a run and --overwrite starts it over; give one")
    if args.seeds is None and args.parallel != 1:
        parser.error("--parallel sets how many seeds train at once; add --seeds (e.g. 1-4)")
    if args.run_dir is not None:
        check_folder(args.run_dir, "run folder")  # a link loop names no folder
    if args.seeds is not None and args.preflight:  # one rehearsal: the seed changes no launch
        check_seed_overrides(args.overrides)
        parse_seeds(args.seeds)
        return preflight(load_recipe_or_import(args.recipe, args.overrides, run_dir=args.run_dir))
    if args.seeds is not None:
        return main_seeds(args)
    recipe = load_recipe_or_import(args.recipe, args.overrides, run_dir=args.run_dir)
    if args.dry_run:
        return dry_run(recipe, args.engine, resume=args.resume, overwrite=args.overwrite)
    if args.preflight:
        return preflight(recipe)
    engine = choose_engine(recipe, args.engine)
    # what the engine refuses once it runs (rules, hand-set output folders), refused now
    check_engine(recipe, engine, resume=args.resume, overwrite=args.overwrite)
    probe_loggers(recipe.config)  # a dead MLflow or W&B endpoint: refused before Ray starts
    kwargs = dict(resume=args.resume, progress=not args.no_progress, overwrite=args.overwrite)
    if engine == "local":
        from nemo_fp8_rl.engines.local import run
    else:
        from nemo_fp8_rl.engines.nemo import run
    previous = raise_on_sigterm()  # `kill` ends the run as Ctrl-C does (exit 130), cleanly
    try:
        run_dir = run(recipe, **kwargs)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"run finished: {run_dir}")
    print_summary(run_dir)
    if engine == "local":
        print_run_note(run_dir, recipe.config["loss_fn"])
    return 0


def print_run_note(run_dir, loss_fn: dict) -> None:
    """What this embedded run shows (`study.run_note`), after the closing summary."""
    from nemo_fp8_rl.runs.summary import read_records
    from nemo_fp8_rl.study.run_note import run_note

    lines = run_note(read_records(run_dir), loss_fn["ratio_clip_min"], loss_fn["ratio_clip_max"])
    if lines:
        print("\n".join(lines))


def dry_run(recipe, requested: str, *, resume: bool = False, overwrite: bool = False) -> int:
    """Print the resolved recipe and the engine that would run it. Where no engine can run it
    here, one line on stderr says so (the recipe is valid; which engine a real run needs; how
    to get it) and the exit code is 3, as the real `train`'s (`recipes validate` is the check
    that exits 0), after the guard rails that need no NeMo RL (`cli.guard_gate`: exit 2 when
    they refuse the recipe, as `submit` does); where the engine would refuse the recipe (`engines.choose.check_engine`: its
    rules, hand-set output folders), exit 2 as the real `train` does (the error line on stderr,
    after the YAML, so that it is the last thing a terminal shows)."""
    print(recipe.to_yaml(), end="")
    try:
        engine = choose_engine(recipe, requested)
    except EngineUnavailable as exc:
        print(f"# engine: none usable here  run dir: {recipe.run_dir}")
        if recipe.config["cluster"]["gpus_per_node"] > 0:  # what needs no NeMo RL still runs
            from nemo_fp8_rl.cli.guard_gate import guard_gate

            guard_gate(recipe, "refused (dry run)", "; then run it where NeMo RL is installed")
        why = exc.what.partition("not usable here: ")[2].split(". ")[0] or exc.what
        where = (
            "in NeMo RL's CPU environment (bash scripts/nemo-rl-env.sh /path/to/nemo-rl -- "
            "python -m nemo_fp8_rl.train ...)"
            if recipe.on_cpu
            else "where NeMo RL is installed (docs/cluster.md), or on Slurm with nemo_fp8_rl.submit"
        )
        raise EngineUnavailable(
            f"{recipe.name} (dry run)",
            f"the recipe is valid; a real run needs the NeMo RL engine, not usable here ({why})",
            f"run it {where}; nemo_fp8_rl.recipes validate checks a recipe and exits 0",
        ) from None
    print(f"# engine: {engine}  run dir: {recipe.run_dir}")
    check_engine(recipe, engine, resume=resume, overwrite=overwrite)
    return 0


def preflight(recipe) -> int:
    """Rehearse the launch; print the report; a failed rehearsal is a usage error (exit 2)."""
    require_nemo_rl("--preflight")
    from nemo_fp8_rl.engines.nemo.preflight import preflight as rehearse

    result = rehearse(recipe)
    print(result.report())
    if not result.ok:
        raise UsageError(
            recipe.name,
            f"the preflight found {result.problem_count} problem(s), listed above",
            "fix each in the recipe (or with an override), then run --preflight again",
        )
    return 0


def trains(argv: list[str]) -> bool:
    """Whether `argv` trains one run (not --dry-run, --preflight, --seeds, --help or a usage
    error, which `main` reports itself); parsed silently."""
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            args = _parser().parse_intermixed_args(argv)
    except SystemExit:
        return False
    return not (args.dry_run or args.preflight or args.seeds is not None)


def entry() -> None:
    """The console script: a training run goes through `runs.ray_exit.supervise` (Ray ending
    the process while it registers with its raylet is located and retried); the rest, and the
    supervised child itself, run `main` in this process."""
    from nemo_fp8_rl.runs import ray_exit

    argv = sys.argv[1:]
    if not ray_exit.is_child() and trains(argv):
        sys.exit(ray_exit.supervise([sys.executable, "-m", "nemo_fp8_rl.cli.train", *argv]))
    run_main(main)()


if __name__ == "__main__":
    entry()
