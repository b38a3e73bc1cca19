"""The commands that add seeds to a comparison of single runs, ready to paste.

Each recipe is trained over more seeds in a new folder (a single-seed run's own folder cannot
also hold `seed-<k>` runs), from its recipe (`recipe_ref`), on the engine its run was trained on: a run of NeMo RL's loop on CPU
(`environment.json` says `engine: nemo` on a CPU recipe) trains again with `--engine nemo` inside
NeMo RL's environment (`scripts/nemo-rl-env.sh` with the NeMo RL tree the run used), so its
seeds are never pooled with embedded-engine runs; a GPU run, inside NeMo RL's environment.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from nemo_fp8_rl.analysis.rundata import RunData
from nemo_fp8_rl.config.commands import command, project_root


def run_engine(run: RunData) -> tuple[str, str | None]:
    """(engine, NeMo RL tree) from the run's `environment.json`: `local` when it says nothing."""
    path = run.path if run.path.is_dir() else run.path.parent
    try:
        env = json.loads((path / "environment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "local", None
    if not isinstance(env, dict):
        return "local", None
    location = env.get("nemo_rl_location")
    tree = str(Path(location).parent) if isinstance(location, str) and location else None
    return str(env.get("engine") or "local"), tree


def _env_script() -> str:
    script = project_root() / "scripts" / "nemo-rl-env.sh"
    try:
        return str(script.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(script)


def recipe_ref(name: str) -> str:
    """What `--recipe` takes for the recipe a run is named after: its short name when the
    project's recipes hold it, else `<name>.yaml` in this folder (a copy made with `recipes cp`
    or an imported config, trained from here), else a placeholder that says what to put."""
    from nemo_fp8_rl.config import RecipeError, resolve_ref

    try:
        resolve_ref(name)
    except RecipeError:
        local = Path(f"{name}.yaml")
        return str(local) if local.is_file() else f"<the recipe file of {name}>"
    return name


def train_command(recipe: str, run: RunData | None, seeds: str) -> str:
    """The `train --seeds` line for `recipe`, on the engine `run` was trained on."""
    ref = shlex.quote(recipe_ref(recipe))
    args = f"--recipe {ref} --seeds {seeds} --run-dir runs/{recipe}-seeds"
    engine, tree = run_engine(run) if run is not None else ("local", None)
    if engine != "nemo":
        return f"{command('train')} {args}"
    gpus = ((run.config or {}).get("cluster") or {}).get("gpus_per_node")
    if gpus == 0:  # NeMo RL's loop on this CPU
        where = shlex.quote(tree) if tree else "/path/to/nemo-rl"
        return (
            f"bash {shlex.quote(_env_script())} {where} -- python -m nemo_fp8_rl.train {args} "
            "--engine nemo"
        )
    return f"python -m nemo_fp8_rl.train {args} --engine nemo   # in NeMo RL's environment"


def more_seeds_commands(
    recipes: Sequence[str], runs: Sequence[RunData | None] = (), seeds: str = "1-3"
) -> list[str]:
    """One `train --seeds` line per recipe (its run, where given, names the engine), then
    the `compare` of the new folders."""
    runs = list(runs) or [None] * len(recipes)
    lines = [train_command(r, run, seeds) for r, run in zip(recipes, runs, strict=True)]
    return [*lines, f"{command('compare')} " + " ".join(f"runs/{r}-seeds" for r in recipes)]
