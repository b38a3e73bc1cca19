"""The run directory, for every engine: the resolved recipe and environment saved with the run,
and a guard so that nothing is destroyed by accident.

`check_owner` runs before anything is written. It refuses a path that is a file, `/` or the home
folder; a non-empty folder that holds no run (only `slurm/`, the job files `nemo_fp8_rl.submit`
writes, `train.log`, the log `--seeds` tees each seed's run into, and the lock file may be
there); a multi-seed run (`seed-<k>/`, `seeds.json`: use `--seeds`); a run of another recipe;
and a run of this recipe that completed a step, unless the user said what to do with it:
`--resume` continues it (same settings up to `RESUMABLE_KEYS`), `--overwrite` starts it again.
A run that never completed its first step (no step logged, no checkpoint: Ray did not start,
the warm-up was interrupted) has nothing to keep and starts over with the same command.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.errors import RecipeError
from nemo_fp8_rl.config.output_paths import protected_folders
from nemo_fp8_rl.config.placement import CPU
from nemo_fp8_rl.config.safe_files import check_folder, write_atomic
from nemo_fp8_rl.config.safe_yaml import load_yaml_file
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.runs.lock import LOCK_NAME
from nemo_fp8_rl.runs.outputs import check_removable, kept_note, remove_ours
from nemo_fp8_rl.runs.seeds import SUMMARY_NAME, seed_of_dir

# Keys that may differ between a run and its resumption (run length, logging, output places).
RESUMABLE_KEYS = (
    "grpo.max_num_steps",
    "grpo.val_at_end",
    "checkpointing.save_period",
    "checkpointing.keep_top_k",
    "checkpointing.checkpoint_dir",
    "logger.log_dir",
    "local.progress",
    "health.",  # what the run does on a breach, not what it trains
)


class RunDirError(UsageError):
    """The run directory holds something this run must not overwrite (exit code 2)."""

    def __init__(self, where: Path | str, what: str, fix: str) -> None:
        super().__init__(where, f"{what}; nothing was written", fix)


# Entries a folder may hold before its first run: the job files `nemo_fp8_rl.submit` writes,
# the log the seeds launcher opens before it starts the seed's run (`nemo_fp8_rl.runs.seeds`)
# and the run's lock file (`nemo_fp8_rl.runs.lock`).
_PRE_RUN = {"slurm", "train.log", LOCK_NAME}
# What a new run of the same recipe clears from the run dir (`prepare`).
STALE = ("checkpoints", "logs", "metrics.jsonl", "model", "environment.json")


@dataclass(frozen=True)
class RunProgress:
    """How far a run got: the highest step in `metrics.jsonl` and its `step_*` checkpoints."""

    steps: int
    checkpoints: tuple[str, ...]

    @property
    def started(self) -> bool:
        """True once the run completed a GRPO step (a step >= 1 logged, or a checkpoint saved);
        a run that never got there has nothing to keep and starts over by itself."""
        return self.steps > 0 or bool(self.checkpoints)


def run_progress(run_dir: Path, config: dict | None = None) -> RunProgress:
    """The progress recorded in `run_dir` (checkpoints under `run_dir/checkpoints` and, for the
    cluster engine, `checkpointing.checkpoint_dir` of `config`). A garbled metrics line counts
    as a logged step: unreadable progress is kept, never thrown away."""
    steps = 0
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                step = json.loads(line).get("step", 0) if line.strip() else 0
                steps = max(steps, int(step))
            except (ValueError, TypeError, AttributeError):
                steps = max(steps, 1)
    roots = [Path(run_dir) / "checkpoints"]
    ckpt_dir = ((config or {}).get("checkpointing") or {}).get("checkpoint_dir")
    if isinstance(ckpt_dir, str) and ckpt_dir:
        roots.append(Path(ckpt_dir))
    found = sorted({p.name for root in roots if root.is_dir() for p in root.glob("step_*")})
    return RunProgress(steps, tuple(found))


def _seed_entries(run_dir: Path) -> list[str]:
    """The `seed-<k>` folders and `seeds.json` of a multi-seed run in `run_dir`."""
    return sorted(
        p.name
        for p in run_dir.iterdir()
        if p.name == SUMMARY_NAME or (p.is_dir() and seed_of_dir(p) is not None)
    )


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b": value} for every leaf of nested dicts."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two resolved configs (resumable keys ignored)."""
    a, b = flatten(saved), flatten(current)
    keys = sorted(set(a) | set(b))
    ignored = tuple(RESUMABLE_KEYS)
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in keys
        if a.get(k) != b.get(k) and not k.startswith(ignored)
    ]


def _json_roundtrip(config: dict) -> dict:
    """The config as it reads back from YAML (tuples become lists, etc.)."""
    return yaml.safe_load(yaml.safe_dump(config, sort_keys=False))


def check_owner(
    run_dir: Path, config: dict, *, resume: bool = False, overwrite: bool = False
) -> None:
    """Refuse a `run_dir` this run must not write into (see the module docstring); writes nothing."""
    run_dir = Path(run_dir)
    check_place(run_dir)
    if not run_dir.exists():
        if resume:
            raise RunDirError(
                run_dir, "--resume given but the folder does not exist", "drop --resume to start"
            )
        return
    saved_path = run_dir / "recipe.yaml"
    if not saved_path.exists():
        entries = sorted(p.name for p in run_dir.iterdir())
        seeds = _seed_entries(run_dir)
        if seeds:
            shown = ", ".join(seeds[:4]) + (", ..." if len(seeds) > 4 else "")
            raise RunDirError(
                run_dir,
                f"holds a multi-seed run ({shown}), made by --seeds",
                "add --seeds to work with it (e.g. --seeds 1-3), or pass --run-dir with another "
                "folder for a single run",
            )
        if set(entries) - _PRE_RUN:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise RunDirError(
                run_dir,
                f"folder holds files that are not a run of this recipe ({shown})",
                "pass --run-dir with a new or empty folder, or move those files away",
            )
        if resume:
            raise RunDirError(run_dir, "--resume given but no run here yet", "drop --resume")
        return
    _check_saved(run_dir, saved_path, config, resume=resume, overwrite=overwrite)
    if not resume:  # what `prepare` clears must be ours to delete (a link there is refused)
        check_removable([run_dir / s for s in STALE], run_dir)


def check_place(run_dir: Path) -> None:
    """A run dir is a folder, and never `/` or the home folder."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(run_dir, "is a file, not a folder", "pass --run-dir with a folder path")
    resolved = check_folder(run_dir, "run folder")
    if resolved in protected_folders():
        raise RunDirError(
            run_dir,
            "is the root or home folder, which a run must not write into",
            "pass --run-dir runs/<name> (any new folder)",
        )


def _check_saved(
    run_dir: Path, saved_path: Path, config: dict, *, resume: bool, overwrite: bool
) -> None:
    """The folder holds a run: refuse another recipe's; this recipe's needs --resume or --overwrite."""
    try:
        saved = load_yaml_file(saved_path) or {}
        saved_name = saved.get("logger", {}).get("wandb", {}).get("name")
    except (RecipeError, AttributeError) as exc:
        why = exc.issues[0].what if isinstance(exc, RecipeError) else "not a recipe"
        raise RunDirError(
            saved_path,
            f"cannot read the saved recipe ({why})",
            f"restore it, or pass --run-dir to write elsewhere (or delete {run_dir})",
        ) from exc
    name = config.get("logger", {}).get("wandb", {}).get("name")
    if saved_name != name:
        raise RunDirError(
            run_dir,
            f"already holds a run of recipe {saved_name!r}, not {name!r}"
            if saved_name
            else f"already holds a run whose recipe.yaml names no recipe, not {name!r}",
            f"pass --run-dir to write elsewhere, or delete {run_dir} yourself",
        )
    if overwrite:
        return
    progress = run_progress(run_dir, saved)
    if not progress.started:
        return  # never reached its first step: nothing to keep, it starts over
    diffs = config_differences(saved, _json_roundtrip(config))
    if diffs:
        shown = "; ".join(diffs[:5]) + ("; ..." if len(diffs) > 5 else "")
        raise RunDirError(
            run_dir,
            f"already holds a run of {name!r} with different settings ({shown})",
            "pass --run-dir to write elsewhere, or --overwrite to start this run over"
            + (" (a resumed run keeps its settings)" if resume else ""),
        )
    if not resume and not progress.checkpoints:
        raise RunDirError(
            run_dir,
            f"already holds a run of {name!r} that logged {progress.steps} step(s) but saved no "
            "checkpoint to continue from",
            "pass --overwrite to start it over, or --run-dir to write elsewhere",
        )
    if not resume:
        raise RunDirError(
            run_dir,
            f"already holds a run of {name!r}",
            "pass --resume to continue it, --overwrite to start it over, or --run-dir to "
            "write elsewhere",
        )


def prepare(
    run_dir: Path, config: dict, recipe_yaml: str, *, resume: bool, overwrite: bool = False
) -> None:
    """`check_owner`, then clear a previous run of the same recipe unless resuming, and write
    `recipe_yaml` (the resolved recipe) as `recipe.yaml`."""
    check_owner(run_dir, config, resume=resume, overwrite=overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        kept = remove_ours([run_dir / s for s in STALE], run_dir)  # a link: refused, kept
        if kept:
            print(f"note: {run_dir}: {kept_note(kept)}", file=sys.stderr)
    atomic_write(run_dir / "recipe.yaml", recipe_yaml)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (never a half-written file,
    never through a symbolic link; `safe_files.write_atomic`)."""
    write_atomic(path, text)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _earlier(path: Path) -> dict[str, Any]:
    """The `environment.json` at `path` when this process wrote it (an engine rewrites the file
    at the end of its run: the start time and start provenance stay those of the start), else {}."""
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return env if isinstance(env, dict) and env.get("pid") == os.getpid() else {}


def read_environment(run_dir: Path) -> dict[str, Any] | None:
    """The run's `environment.json` (engine, generator, NeMo RL, versions), or None when it has
    none or it does not parse as a JSON object."""
    try:
        env = json.loads((run_dir / "environment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def write_environment(
    run_dir: Path, engine: str, extra: dict[str, Any], placement: str = CPU
) -> None:
    """Record engine, placement, versions, host, threads and provenance (plus `extra`) in
    `environment.json`.

    `placement` is where the run was placed, `cpu` or `gpu` (`config.placement`; the embedded
    engine runs on CPU): readers of a finished run (`evals`) take it from here.

    `started_at` is when this process first wrote the file; `updated_at`, this write.
    `provenance` (`runs.provenance.snapshot`: code commit and dirty tree, time, 1-minute load,
    CPU model and cores) has `start` from the first write and `end` from each later one (None
    until the engine writes the file again at the end of its run).
    """
    import torch

    from nemo_fp8_rl.runs import provenance

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    earlier = _earlier(run_dir / "environment.json")
    start = (earlier.get("provenance") or {}).get("start")
    env = {
        "engine": engine,
        "placement": placement,
        "started_at": earlier.get("started_at") or now,
        "updated_at": now,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            d: _version(d)
            for d in ("nemo-fp8-rl", "torch", "transformers", "tokenizers", "ray", "pydantic")
        },
        "env": {k: os.environ[k] for k in ("RAY_ADDRESS", "SLURM_JOB_ID") if k in os.environ},
        "provenance": {
            "start": start or provenance.snapshot(),
            "end": provenance.snapshot() if start else None,
        },
        **extra,
    }
    atomic_write(run_dir / "environment.json", json.dumps(env, indent=1, default=str) + "\n")
