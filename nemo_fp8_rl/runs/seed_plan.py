"""What a `--seeds` launch does with each seed's run directory, decided before anything starts.

The group folder (`runs/<recipe name>` or `--run-dir`) must be a folder that holds no
single-seed run, and its `seeds.json`, if any, one this launcher wrote. Then, per seed:

| the seed's folder holds                    | plain        | --resume   | --overwrite |
|--------------------------------------------|--------------|------------|-------------|
| nothing, or a run that never did a step    | start        | start      | start       |
| a run that finished all its steps          | keep         | keep       | start over  |
| a run stopped part-way (checkpoints)       | refused: fix | resume     | start over  |

so the same `--seeds 1-3` command, run again after a seed was killed before its first step,
finishes the missing seed, and `--resume` finishes one killed part-way, keeping the others.
`train --seeds` and `submit --seeds` (a Slurm job array) both plan with `seed_actions` and say
what they will do with `plan_line`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.nemo_import import load_recipe_or_import
from nemo_fp8_rl.runs.lock import LOCK_NAME
from nemo_fp8_rl.runs.outputs import check_hand_set
from nemo_fp8_rl.runs.rundir import RunDirError, check_owner, check_place, flatten, run_progress
from nemo_fp8_rl.runs.seeds import (
    SEED_KEY,
    SUMMARY_NAME,
    read_summary,
    seed_overrides,
    seed_run_dir,
)

ACTIONS = ("start", "resume", "overwrite")  # the actions that train a seed (`keep` does not)


def check_group(group: Path) -> None:
    """Refuse a group folder that is a file or holds a single-seed run; check `seeds.json`.

    Raises:
        RunDirError: `group` is a file, or holds a run made without --seeds.
        SummaryError: `group/seeds.json` is not one this launcher wrote.
    """
    group = Path(group)
    check_place(group)  # a file, `/` or the home folder: refused as a single run refuses them
    saved = group / "recipe.yaml"
    if saved.is_file():
        raise RunDirError(
            group,
            "holds a single-seed run (recipe.yaml), and --seeds would put seed-<k>/ folders "
            "inside it",
            f"pass --run-dir with another folder for the seeds (e.g. {group}-seeds), or move "
            "that run away",
        )
    foreign = (
        sorted(p.name for p in group.iterdir() if not _GROUP_ENTRY.fullmatch(p.name))
        if (group.is_dir())
        else []
    )
    if foreign and not saved.is_file():
        shown = ", ".join(foreign[:5]) + (
            f", and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise RunDirError(
            group,
            f"folder holds files that are not a seed group ({shown})",
            "pass --run-dir with a new or empty folder, or move those files away",
        )
    read_summary(group)


# What a seed group holds: seed-<k>/ runs (and their logs), seeds.json, the lock, the job
# files `submit --seeds` writes (slurm/), the atomic writer's temporary files.
_GROUP_ENTRY = re.compile(
    rf"seed-\d+(\.log)?|{re.escape(SUMMARY_NAME)}|{re.escape(LOCK_NAME)}|slurm|\.[\w.-]+\.tmp"
)


def check_resumable(actions: dict[int, str], resume: bool) -> None:
    """Refuse `--resume` when no seed has a run stopped part-way to continue (a finished seed is
    kept, a missing one started, with or without it: the flag would do nothing)."""
    if resume and "resume" not in actions.values():
        raise RunDirError(
            "--resume",
            "no seed holds a run stopped part-way, so there is nothing to resume",
            "drop --resume (missing seeds start and finished ones are kept without it)",
        )


def seed_action(run_dir: Path, config: dict, *, resume: bool, overwrite: bool) -> str:
    """`start`, `resume`, `overwrite` or `keep` for one seed's folder (see the module table).

    Raises:
        RunDirError: the folder holds another recipe's run, a run with other settings, or
            (without --resume or --overwrite) a run stopped part-way.
    """
    if overwrite:
        check_owner(run_dir, config, overwrite=True)
        return "overwrite"
    if not (run_dir / "recipe.yaml").is_file():
        check_owner(run_dir, config)
        return "start"
    progress = run_progress(run_dir, config)
    if not progress.started:
        check_owner(run_dir, config)
        return "start"
    steps = config["grpo"]["max_num_steps"]
    finished = progress.steps >= steps and (
        not config["checkpointing"]["enabled"] or f"step_{steps}" in progress.checkpoints
    )
    check_owner(run_dir, config, resume=finished or resume)
    return "keep" if finished else "resume"


def seed_actions(
    base: Any, seeds: Sequence[int], overrides: Sequence[str], *, resume: bool, overwrite: bool
) -> dict[int, str]:
    """Each seed's action (`seed_action`) for the recipe `base` with `overrides`, in seed order.

    Every seed's recipe (`overrides` plus `grpo.seed=<k>`) is loaded and its folder
    `<base.run_dir>/seed-<k>` checked before the first seed's action is returned, so a bad key
    or a foreign folder fails for the whole launch. The group folder is checked by `check_group`.
    """
    actions: dict[int, str] = {}
    for seed in seeds:
        run_dir = seed_run_dir(base.run_dir, seed)
        extra = seed_overrides(base, seed, overrides)
        recipe = load_recipe_or_import(
            base.path, [*extra, f"{SEED_KEY}={seed}"], run_dir=run_dir, announce=False
        )
        action = seed_action(run_dir, recipe.config, resume=resume, overwrite=overwrite)
        if action != "keep":  # its hand-set output folders, as a single run checks them
            check_hand_set(recipe, resume=action == "resume", overwrite=action == "overwrite")
        actions[seed] = action
    check_resumable(actions, resume)
    return actions


def plan_line(group: Path, actions: dict[int, str], how: str) -> str:
    """`<n> seed(s) of <group> <how>; kept (finished before): 1; start: 2, 3; resume: 4`.

    `n` counts the seeds that train (every action but `keep`); an action with no seed is left out.
    """

    def seeds_of(action: str) -> str:
        return ", ".join(str(s) for s, a in actions.items() if a == action)

    trained = sum(a != "keep" for a in actions.values())
    parts = [f"{trained} seed(s) of {Path(group).name} {how}"]
    labels = {"keep": "kept (finished before)", **{a: a for a in ACTIONS}}
    parts += [f"{label}: {seeds_of(a)}" for a, label in labels.items() if seeds_of(a)]
    return "; ".join(parts)


def seed_keys(base: Any, overrides: Sequence[str]) -> tuple[str, ...]:
    """The dotted keys whose value is the seed: `grpo.seed` and every key the recipe ties to it
    (`data.train.seed: ${grpo.seed}` in the base config), found by loading the recipe with two
    seeds. A job array's task sets them all, as `train --seeds` gets them by loading the recipe
    with its seed: the frozen recipe an array trains with has the interpolations resolved."""
    one, two = (
        flatten(
            load_recipe_or_import(base.path, [*overrides, f"{SEED_KEY}={k}"], announce=False).config
        )
        for k in (1, 2)
    )
    return tuple(k for k in one if one[k] == 1 and two.get(k) == 2 and type(one[k]) is int)
