"""`nemo_fp8_rl.train --recipe R --seeds 1-3 [--parallel N]`: one recipe over several seeds.

Every seed's recipe is loaded and its run directory checked before anything starts (a bad key
or another recipe's run fails at once, for all seeds); then each seed trains in its own child
process (`nemo_fp8_rl.runs.seeds`). Exit code 0 when every seed finished, 1 when any failed.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from nemo_fp8_rl.cli.common import SEEDS_SYNTAX
from nemo_fp8_rl.config.commands import command
from nemo_fp8_rl.config.nemo_import import load_recipe_or_import
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.runs.seeds import (
    SEED_KEY,
    SeedSpecError,
    check_overrides,
    parse_seeds,
    run_seeds,
    seed_overrides,
    seed_run_dir,
    summary_lines,
    train_command,
)


def add_seed_args(parser: argparse.ArgumentParser) -> None:
    """`--seeds LIST` and `--parallel N`."""
    parser.add_argument(
        "--seeds",
        metavar="SEEDS",
        help=f"train once per seed, in <run dir>/seed-<k> with {SEED_KEY}=<k>; seeds as "
        f"{SEEDS_SYNTAX}",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="with --seeds: how many seeds train at once (default 1: one after another)",
    )


def plan(args: argparse.Namespace) -> tuple[Path, dict[int, list[str]], str]:
    """Load and check every seed's recipe; returns (group dir, child commands, engine).

    Seeds whose run finished in an earlier launch get no command; `args.kept` lists them and
    `args.actions` holds every seed's action (`nemo_fp8_rl.runs.seed_plan` decides, per seed,
    to start, resume, start over or keep).

    Raises:
        SeedSpecError: bad --seeds / --parallel, or a grpo.seed override.
        RecipeError: a seed's recipe does not load.
        RunDirError: the group folder is a file or a single-seed run; a seed's run directory
            holds another recipe's run, or one stopped part-way without --resume.
        EngineUnavailable: no engine can run the recipe here.
    """
    from nemo_fp8_rl.engines.choose import check_engine, choose_engine
    from nemo_fp8_rl.runs.lock import check_free
    from nemo_fp8_rl.runs.rundir import check_place
    from nemo_fp8_rl.runs.seed_plan import check_group, seed_actions

    seeds = parse_seeds(args.seeds)
    if args.parallel < 1:
        raise SeedSpecError(f"--parallel {args.parallel}", "below 1", "give 1 or more")
    check_overrides(args.overrides)
    base = load_recipe_or_import(args.recipe, args.overrides, run_dir=args.run_dir)
    group = base.run_dir
    check_place(group)  # `/` or the home folder: refused as plain train refuses it
    check_group(group)
    check_free(group)
    for seed in seeds:  # a seed's folder another process trains in: refused before any child
        check_free(seed_run_dir(group, seed))
    engine = choose_engine(base, args.engine)
    # refused before any seed starts, as a single run refuses it (each seed's hand-set output
    # folder, `<path>/seed-<k>`, is checked by `seed_actions`)
    check_engine(base, engine, outputs=False)
    args.actions = seed_actions(
        base, seeds, args.overrides, resume=args.resume, overwrite=args.overwrite
    )
    args.kept = [seed for seed, action in args.actions.items() if action == "keep"]
    commands = {
        seed: train_command(
            base.path,
            seed_run_dir(group, seed),
            seed,
            seed_overrides(base, seed, args.overrides),
            engine=engine,
            resume=action == "resume",
            overwrite=action == "overwrite",
        )
        for seed, action in args.actions.items()
        if action != "keep"
    }
    return group, commands, engine


def main_seeds(args: argparse.Namespace) -> int:
    """Plan, then run (or with --dry-run print) every seed; print the per-seed summary."""
    group, commands, engine = plan(args)  # a bad seed list, run dir or engine: its error line
    from nemo_fp8_rl.runs.seed_plan import plan_line

    print(plan_line(group, args.actions, f"on the {engine} engine, {args.parallel} at a time"))
    if args.dry_run:
        for seed, cmd in commands.items():
            print(f"seed {seed}: {shlex.join(cmd)}")
        return 0
    from nemo_fp8_rl.runs.lock import hold

    hold(group)  # one launch per group folder (each seed's run also locks its own folder)
    outcomes = run_seeds(commands, group, parallel=args.parallel, kept=args.kept)
    print("---- seeds ----")
    for line in summary_lines(outcomes):
        print(line)
    print(f"compare with: {command('compare')} {shlex.quote(str(group))} <other recipe's run dir>")
    failed = [o.seed for o in outcomes if not o.ok]
    if failed:
        raise UserError(
            str(group),
            f"{len(failed)} of {len(outcomes)} seed(s) failed ({', '.join(map(str, failed))})",
            f"read each failed seed's train.log in {group}/seed-<k>/, fix the cause, and train "
            "those seeds again",
        )
    return 0
