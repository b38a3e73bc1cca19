"""What a run may delete, and the checks a hand-set output folder gets before a run uses it.

One predicate decides what is ours to delete (`ours_to_delete`): a path inside the run
directory under one of the names a run writes there (`RUN_OUTPUTS`: `checkpoints`, `logs`,
`metrics.jsonl`, ...), that is not a symbolic link and not inside an output path the user set
by hand. Nothing else is ever removed by `--overwrite` or a new run: a hand-set
`checkpointing.checkpoint_dir` or `logger.log_dir` is the user's folder, whatever it holds.
`remove_ours` removes such paths once all pass (`check_removable`), so a refusal removes
nothing. Inside an output folder it removes entry by entry only what the project's record of a
run's writers names (`OUTPUT_ENTRIES`: `step_N` checkpoints, `latest`, `tb/`, `exp_N/`, the
model's files, ...), and inside a checkpoint that carries the embedded engine's `manifest.json`
only the files the manifest lists: a user's notebook in `logs/` or a kept checkpoint copy
(`checkpoints/step_10-keep`) stays, and is named.

`check_hand_set` runs before a run uses a hand-set output folder (train, its dry run, submit,
and each seed of --seeds), after the place checks made at load (`config.output_paths`: `/`,
the home folder, a link, a file, the run directory). It refuses a folder that holds anything
but what NeMo RL writes there (`step_N`/`tmp_step_N` checkpoints, `exp_N` log folders: user
files), a folder inside another run's directory or holding another run's checkpoints, and,
for `checkpoint_dir`, checkpoints of this run unless `--resume` continues them (`--overwrite`
does not remove them: they are not ours to delete).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.output_paths import hand_set
from nemo_fp8_rl.config.safe_yaml import load_yaml_file
from nemo_fp8_rl.config.schema import PATH_KEYS
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.tiny import INPUTS

# What a run writes under its run directory and a new run of the same recipe clears (the
# NeMo RL engine adds its hand-off inputs and the package link its workers import).
RUN_OUTPUTS = (
    "checkpoints",
    "logs",
    "metrics.jsonl",
    "model",
    "environment.json",
    INPUTS,
    "pythonpath",
)
# What NeMo RL writes into a hand-set folder: CheckpointManager's `step_N` and `tmp_step_N`,
# the logger's `exp_N` (`get_next_experiment_dir`).
NEMO_RL_ENTRIES = {
    "checkpointing.checkpoint_dir": re.compile(r"(tmp_)?step_\d+"),
    "logger.log_dir": re.compile(r"exp_\d+"),
}
MAX_SHOWN = 5
# What the project's writers (and NeMo RL's, in the folders it is handed) create inside each
# output folder of the run directory: the record `remove_ours` deletes by, entry by entry.
OUTPUT_ENTRIES = {
    "checkpoints": re.compile(r"(tmp_)?step_\d+|\.tmp_step_\d+_\w+|latest|\.latest\.\w+\.tmp"),
    "logs": re.compile(r"tb|wandb|mlflow|exp_\d+"),
    "model": re.compile(
        r"config\.json|generation_config\.json|model[\w.-]*\.safetensors(\.index\.json)?"
        r"|tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json"
        r"|vocab\.\w+|merges\.txt|chat_template\.\w+|\.[\w.-]+\.tmp"
    ),
    "nemo-inputs": re.compile(r"model|(train|validation)\.jsonl|\.[\w.-]+\.tmp|\.model\.[\w-]+"),
}
CHECKPOINT_MANIFEST = "manifest.json"  # the embedded engine's record of a checkpoint's files


class NotOurs(UsageError):
    """A path the project did not create, which it will not delete (exit 2)."""


def _real(path: Path) -> Path:
    """`path` with its folders resolved but its last component kept (a link stays a link)."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def ours_to_delete(path: Path, run_dir: Path, hand_set_paths: Iterable[Path] = ()) -> bool:
    """Whether `path` is a run output the project created and may delete: inside `run_dir`
    under one of `RUN_OUTPUTS`, not a symbolic link, not inside a hand-set output path."""
    path = Path(path)
    if path.is_symlink():
        return False
    real = _real(path)
    root = Path(os.path.realpath(run_dir))
    if root not in real.parents:
        return False
    if real.relative_to(root).parts[0] not in RUN_OUTPUTS:
        return False
    for mine in hand_set_paths:
        theirs = _real(Path(mine))
        if real == theirs or theirs in real.parents or real in theirs.parents:
            return False
    return True


def check_removable(
    paths: Iterable[Path], run_dir: Path, hand_set_paths: Iterable[Path] = ()
) -> None:
    """Refuse (`NotOurs`) the first of `paths` that exists but is not ours to delete."""
    mine = list(hand_set_paths)
    for path in map(Path, paths):
        if not path.exists() and not path.is_symlink():
            continue
        if not ours_to_delete(path, run_dir, mine):
            what = (
                "is a symbolic link" if path.is_symlink() else "is not an output this run created"
            )
            raise NotOurs(
                path,
                f"{what}, so it is not removed; nothing was removed",
                "remove or move it yourself, or pass --run-dir with a new folder",
            )


def remove_ours(
    paths: Iterable[Path], run_dir: Path, hand_set_paths: Iterable[Path] = ()
) -> list[Path]:
    """Delete what a run created among `paths` once all of them pass `ours_to_delete`
    (`check_removable` first: a refusal removes nothing); a missing path is nothing to do.
    A folder loses only the entries `OUTPUT_ENTRIES` records for it (`_remove_recorded`) and
    goes when nothing else is left; returns what was kept (not a run's), for the caller to name."""
    paths, mine = [Path(p) for p in paths], list(hand_set_paths)
    check_removable(paths, run_dir, mine)
    kept: list[Path] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            kept += _remove_recorded(path, OUTPUT_ENTRIES.get(path.name))
        elif path.exists() or path.is_symlink():
            path.unlink()
    return kept


def _remove_recorded(folder: Path, entries: re.Pattern[str] | None) -> list[Path]:
    """Remove from `folder` the entries `entries` names (all, for a folder of no record, such
    as `pythonpath`), a checkpoint with a manifest file by file; the folder itself when empty.
    Links are removed as links, never followed. Returns the entries kept."""
    kept = []
    for entry in sorted(folder.iterdir()):
        if entries is not None and not entries.fullmatch(entry.name):
            kept.append(entry)
        elif entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        elif (entry / CHECKPOINT_MANIFEST).is_file():
            kept += _remove_manifest(entry)
        else:
            shutil.rmtree(entry)
    if not kept:
        folder.rmdir()
    return kept


def _remove_manifest(step: Path) -> list[Path]:
    """Remove the files a checkpoint's manifest lists, the manifest, and the folder when that
    leaves it empty; anything else in it (a user's file) is kept and returned."""
    try:
        listed = json.loads((step / CHECKPOINT_MANIFEST).read_text(encoding="utf-8"))["files"]
        names = {str(n) for n in listed} | {CHECKPOINT_MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        return [step]  # no record to delete by: kept whole
    kept = []
    for entry in sorted(step.iterdir()):
        if entry.name in names and (entry.is_symlink() or not entry.is_dir()):
            entry.unlink()
        else:
            kept.append(entry)
    if not kept:
        step.rmdir()
    return kept


def kept_note(kept: list[Path]) -> str:
    """One line naming what `remove_ours` kept (the first `MAX_SHOWN`, then how many more)."""
    shown = ", ".join(str(p) for p in kept[:MAX_SHOWN])
    more = f", and {len(kept) - MAX_SHOWN} more" if len(kept) > MAX_SHOWN else ""
    return f"kept {shown}{more}: not written by a run, so not removed"


def hand_set_paths(recipe: Any) -> list[Path]:
    """The output folders of `recipe` set by hand (`PATH_KEYS`)."""
    out = []
    for key in PATH_KEYS:
        if hand_set(recipe.provenance, key):
            section, leaf = key.split(".")
            out.append(Path(recipe.config[section][leaf]))
    return out


def check_hand_set(recipe: Any, *, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse a hand-set output folder a run of `recipe` must not use (module docstring);
    every problem is listed, each at the file that set the key."""
    name = recipe.config["logger"]["wandb"]["name"]
    issues: list[Problem] = []
    for key in PATH_KEYS:
        if not hand_set(recipe.provenance, key):
            continue
        section, leaf = key.split(".")
        folder = Path(recipe.config[section][leaf])
        problem = _folder_problem(key, folder, name, resume=resume, overwrite=overwrite)
        if problem is not None:
            issues.append(Problem(key, f"{folder}: {problem[0]}", problem[1], _src(recipe, key)))
    if issues:
        raise RecipeError(recipe.name, issues)


def _src(recipe: Any, key: str) -> str:
    return recipe.provenance.get(key, "override")


def _folder_problem(
    key: str, folder: Path, name: str, *, resume: bool, overwrite: bool
) -> tuple[str, str] | None:
    """(what, fix) for one hand-set folder, or None."""
    owner = _owning_run(folder)
    if owner is not None and owner[1] != name:
        return (
            f"is inside the run directory {owner[0]} of {owner[1]!r}: another run's outputs",
            "set a folder of its own for this run",
        )
    if not folder.is_dir():
        return None
    entries = sorted(p.name for p in folder.iterdir())
    foreign = [e for e in entries if not _nemo_rl_entry(folder / e)]
    if foreign:
        shown = ", ".join(foreign[:MAX_SHOWN]) + (", ..." if len(foreign) > MAX_SHOWN else "")
        return (
            f"holds files NeMo RL does not write there ({shown}): a run must not mix its outputs "
            "with them, and they are never removed",
            "set an empty or new folder (or one holding only this run's step_N / exp_N folders)",
        )
    if key != "checkpointing.checkpoint_dir":
        return None
    steps = sorted((e for e in entries if e.startswith("step_")), key=_step_number)
    other = _checkpoint_owner(folder, steps)
    if other is not None and other != name:
        return (
            f"holds checkpoints of another run ({other!r}, {steps[-1]})",
            "set a folder of its own for this run",
        )
    if steps and overwrite:
        return (
            f"holds checkpoints ({steps[-1]}); --overwrite removes only what the run created "
            "under its run directory, never a folder set by hand",
            "remove them yourself, set another checkpoint_dir, or pass --resume to continue",
        )
    if steps and not resume:
        return (
            f"already holds checkpoints ({steps[-1]})",
            "pass --resume to continue that run, or set another checkpoint_dir",
        )
    if resume and not steps:
        return "holds no step_N checkpoint to resume from", "drop --resume to start the run"
    return None


def _nemo_rl_entry(path: Path) -> bool:
    """A folder NeMo RL writes into a hand-set output folder (never a link or a file)."""
    if path.is_symlink() or not path.is_dir():
        return False
    return any(p.fullmatch(path.name) for p in NEMO_RL_ENTRIES.values())


def _step_number(name: str) -> int:
    digits = name.rsplit("_", 1)[-1]
    return int(digits) if digits.isdigit() and len(digits) < 40 else -1


def _owning_run(folder: Path) -> tuple[Path, str | None] | None:
    """(run directory, its recipe name) of the nearest folder at or above `folder` that holds
    a run's saved `recipe.yaml`, or None."""
    try:
        here = folder.resolve()
    except (OSError, RuntimeError):
        return None
    for candidate in (here, *here.parents):
        saved = candidate / "recipe.yaml"
        if saved.is_file():
            return candidate, _recipe_name(saved)
    return None


def _recipe_name(path: Path) -> str | None:
    """`logger.wandb.name` of a saved recipe or NeMo RL config (None when unreadable)."""
    try:
        data = load_yaml_file(path)
    except RecipeError:
        return None
    name = ((data.get("logger") or {}).get("wandb") or {}) if isinstance(data, dict) else {}
    value = name.get("name") if isinstance(name, dict) else None
    return value if isinstance(value, str) else None


def _checkpoint_owner(folder: Path, steps: list[str]) -> str | None:
    """The run name NeMo RL saved with the latest checkpoint (`step_N/config.yaml`)."""
    if not steps:
        return None
    saved = folder / steps[-1] / "config.yaml"
    return _recipe_name(saved) if saved.is_file() and not saved.is_symlink() else None
