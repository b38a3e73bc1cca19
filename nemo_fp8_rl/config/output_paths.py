"""Output paths set by hand get the checks a run directory gets, wherever a recipe is loaded.

`checkpointing.checkpoint_dir` and `logger.log_dir` derive from the run directory unless a
recipe or override sets them (NeMo RL's own configs do: `results/grpo`, `logs`); the NeMo RL
engine then writes there. A path set by hand is refused at load (`recipes show` and `validate`
too, each with the file that set it) when it is `/` or the home folder, a symbolic link (a run
writes, and `--overwrite` clears, the folder itself, never through a link), a file, or the run
directory itself. What a folder holds (other files, another run's outputs) is checked when a
run is about to use it (`nemo_fp8_rl.runs.outputs`). `protected_folders` is the one list of
folders no run writes into, for run directories too (`runs.rundir.check_place`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.schema import PATH_KEYS

DERIVED_SOURCE = "derived"


def hand_set(provenance: dict[str, str], key: str) -> bool:
    """Whether the output path `key` came from a recipe file or an override (not derived)."""
    return provenance.get(key, DERIVED_SOURCE) != DERIVED_SOURCE


def protected_folders() -> set[Path]:
    """`/` and the home folder (as the user database and as `$HOME` say), resolved."""
    out = {Path("/"), Path.home().resolve()}
    if os.environ.get("HOME"):
        out.add(Path(os.environ["HOME"]).resolve())
    return out


def place_problem(path: Path, run_dir: Path | None = None) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) for a hand-set output folder, or None when it may be used:
    not a link, not `/` or the home folder, not a file, not the run directory."""
    fix = "set it to a folder of its own, or remove the key (outputs then go under --run-dir)"
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target}), which a run does not write through", fix
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13 on a link loop
        return "is a symbolic link loop, so it names no folder", fix
    if resolved in protected_folders():
        return "is the root or home folder, which a run must not write into", fix
    if path.exists() and not path.is_dir():
        return "is a file, not a folder", fix
    if run_dir is not None and resolved == Path(run_dir).resolve():
        return "is the run directory itself, which holds the run's own files", fix
    return None


def place_issues(config: dict, provenance: dict[str, str], run_dir: Path) -> list[Problem]:
    """One issue per hand-set output path that `place_problem` refuses, located where set."""
    out = []
    for key in PATH_KEYS:
        section, leaf = key.split(".")
        value: Any = (config.get(section) or {}).get(leaf)
        if not hand_set(provenance, key) or not isinstance(value, str) or not value:
            continue
        problem = place_problem(Path(value), run_dir)
        if problem is not None:
            out.append(Problem(key, f"{value}: {problem[0]}", problem[1], provenance[key]))
    return out
