"""The command that runs a recipe again as it was run, and the metric rows a resumed run keeps.

A run that stops part-way (a worker killed, the machine gone) prints the command that continues
it. That command must be the run's own: the recipe as the command line named it, the engine,
the run folder and every `key=value` override, in their order, then `--resume`; a resume
without the overrides would train another recipe from the checkpoint (another step count,
another batch) and `rundir.check_owner` would refuse it or, for the keys a resume may change,
run something else. `train_command` spells it from the loaded `Recipe` (which keeps its
`ref` and `overrides`), with the prefix that runs here (`config.commands.command`).

`keep_completed_rows` is what both engines do to `metrics.jsonl` when a run resumes after
`k` completed steps: the rows of steps after `k` are of steps the resumed run trains again,
so they go (written atomically); rows of steps up to `k`, events included, stay as they were.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from nemo_fp8_rl.config.commands import command
from nemo_fp8_rl.config.recipe import Recipe
from nemo_fp8_rl.config.safe_files import write_atomic


def train_argv(recipe: Recipe, engine: str, flag: str = "--resume") -> list[str]:
    """`nemo_fp8_rl.train`'s arguments that run `recipe` again in its run folder on `engine`:
    the recipe as named, the engine, the folder, its overrides in order, then `flag`
    (`--resume` continues the run, `--overwrite` starts it over)."""
    argv = ["--recipe", recipe.ref or str(recipe.path), "--engine", engine]
    return [*argv, "--run-dir", str(recipe.run_dir), *recipe.overrides, flag]


def train_command(recipe: Recipe, engine: str, flag: str = "--resume") -> str:
    """`train_argv` as one line to paste (shell-quoted, with the prefix that runs here)."""
    return f"{command('train')} {shlex.join(train_argv(recipe, engine, flag))}"


def _step(line: str) -> int | None:
    """The `step` of a JSON row; None for a line that is not one (left as it is)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) else None


def keep_completed_rows(path: Path, completed_steps: int) -> int:
    """Drop the rows of `path` whose step is after `completed_steps` (all of them when it is
    0: the run starts over); returns how many were dropped. A missing file is left missing."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [
        line
        for line in lines
        if completed_steps and ((step := _step(line)) is None or step <= completed_steps)
    ]
    if len(kept) != len(lines):
        write_atomic(path, "".join(f"{line}\n" for line in kept))
    return len(lines) - len(kept)
