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
"""

from __future__ import annotations

from pathlib import Path

from nemo_fp8_rl.runs.rundir import RunDirError, check_owner, run_progress
from nemo_fp8_rl.runs.seeds import read_summary


def check_group(group: Path) -> None:
    """Refuse a group folder that is a file or holds a single-seed run; check `seeds.json`.

    Raises:
        RunDirError: `group` is a file, or holds a run made without --seeds.
        SummaryError: `group/seeds.json` is not one this launcher wrote.
    """
    group = Path(group)
    if group.exists() and not group.is_dir():
        raise RunDirError(group, "is a file, not a folder", "pass --run-dir with a folder path")
    saved = group / "recipe.yaml"
    if saved.is_file():
        raise RunDirError(
            group,
            "holds a single-seed run (recipe.yaml), and --seeds would put seed-<k>/ folders "
            "inside it",
            f"pass --run-dir with another folder for the seeds (e.g. {group}-seeds), or move "
            "that run away",
        )
    read_summary(group)


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
