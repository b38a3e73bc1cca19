"""Run every (recipe, seed) of the study as its own `nemo_fp8_rl.train` process.

Runs go to `<out>/<recipe name>/seed-<k>` with `grpo.seed=k`; at most `jobs` at a time, ordered
recipe by recipe. Before anything starts, `action` decides for every run what to do with its
folder, and refuses what must not be touched:

- no folder (or only the seed launcher's `train.log`): run it;
- a finished run with the study's settings (same resolved recipe, up to output paths, and its
  last metrics record at `grpo.max_num_steps`): keep it;
- an unfinished run with the study's settings: start it again (`train --overwrite`, which
  clears only what a run writes);
- a run with other settings: refused, unless `--overwrite` (then it is run again);
- a folder holding anything else (a user's files): refused, nothing is deleted.

Each run that ends well gets `study_wall_seconds.json` and `study_provenance.json` (the code
commit and dirty flag, UTC time, 1-minute load and machine at its launch and at its end).

A failed run is started again up to `retries` times (on a loaded machine Ray's start can time
out, which says nothing about the recipe); a real failure fails again and is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.errors import RecipeError
from nemo_fp8_rl.config.safe_files import open_nofollow, refuse_link, write_atomic
from nemo_fp8_rl.config.safe_yaml import load_yaml_file
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.runs import provenance
from nemo_fp8_rl.runs.rundir import config_differences
from nemo_fp8_rl.study.analysis import read_records

PRE_RUN = {"train.log"}
# Each finished run's provenance as the launcher saw it (`runs.provenance.snapshot` at its start
# and end, and its wall seconds); archived with the run.
PROVENANCE = "study_provenance.json"


@dataclass(frozen=True)
class RunSpec:
    """One study run: a recipe file, a seed, where it writes, and its resolved config."""

    recipe: Path
    name: str
    seed: int
    run_dir: Path
    steps: int
    overrides: tuple[str, ...] = ()
    config: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class RunResult:
    """How a run ended: return code (0 also for a kept finished run) and wall seconds."""

    spec: RunSpec
    returncode: int
    seconds: float
    reused: bool


def plan(
    recipes: list[Path], seeds: list[int], out: Path, overrides: tuple[str, ...] = ()
) -> list[RunSpec]:
    """The (recipe, seed) runs in launch order (recipe-major); `overrides` go to every run.

    Every recipe is loaded with the overrides and each seed, so a bad override is a
    `RecipeError` here, before anything runs.
    """
    specs = []
    for path in recipes:
        for seed in seeds:
            recipe = load_recipe(path, [*overrides, f"grpo.seed={seed}"])
            steps = recipe.config["grpo"]["max_num_steps"]
            run_dir = out / recipe.name / f"seed-{seed}"
            specs.append(
                RunSpec(path, recipe.name, seed, run_dir, steps, tuple(overrides), recipe.config)
            )
    return specs


def finished(spec: RunSpec) -> bool:
    """True when the run directory holds metrics up to the run's last step."""
    if not (spec.run_dir / "metrics.jsonl").exists():
        return False
    records = read_records(spec.run_dir)
    return bool(records) and records[-1].get("step") == spec.steps


def differences(spec: RunSpec) -> list[str]:
    """Settings of the run saved in `spec.run_dir` that differ from the planned ones
    (`rundir.config_differences`, which leaves out output places and logging; the step count
    is compared here)."""
    path = spec.run_dir / "recipe.yaml"
    try:
        saved = load_yaml_file(path) or {}
    except RecipeError as exc:
        raise UsageError(
            str(path),
            f"cannot read the saved recipe ({exc.issues[0].what})",
            f"restore it, or move {spec.run_dir} away and run the study again",
        ) from exc
    planned = yaml.safe_load(yaml.safe_dump(spec.config, sort_keys=False))
    diffs = config_differences(saved, planned)
    steps = saved.get("grpo", {}).get("max_num_steps") if isinstance(saved, dict) else None
    if steps != spec.steps:
        diffs.insert(0, f"grpo.max_num_steps: {steps!r} -> {spec.steps!r}")
    return diffs


def action(spec: RunSpec, overwrite: bool = False) -> str:
    """`run`, `keep`, `restart` or `rerun` for the run's folder (module docstring); raises
    `UsageError` for a folder the study must not touch. Writes nothing."""
    folder = spec.run_dir
    if folder.exists() and not folder.is_dir():
        raise UsageError(str(folder), "is a file, not a run folder", "move it away or pass --out")
    if not folder.exists():
        return "run"
    if not (folder / "recipe.yaml").exists():
        other = sorted(p.name for p in folder.iterdir() if p.name not in PRE_RUN)
        if other:
            shown = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
            raise UsageError(
                str(folder),
                f"holds files that are not a study run ({shown}); nothing was deleted",
                "move those files away, or pass --out with another folder",
            )
        return "run"
    diffs = differences(spec)
    if diffs:
        if overwrite:
            return "rerun"
        shown = "; ".join(diffs[:3]) + ("; ..." if len(diffs) > 3 else "")
        raise UsageError(
            str(folder),
            f"holds a {spec.name} run with other settings ({shown})",
            "pass --overwrite to run it again with the study's settings, or --out with "
            "another folder",
        )
    return "keep" if finished(spec) else "restart"


def _command(spec: RunSpec, overwrite: bool) -> list[str]:
    return [
        sys.executable, "-m", "nemo_fp8_rl.train", "--recipe", str(spec.recipe),
        "--run-dir", str(spec.run_dir), "--no-progress", *(["--overwrite"] if overwrite else []),
        *spec.overrides, f"grpo.seed={spec.seed}",
    ]  # fmt: skip


def run_all(
    specs: list[RunSpec], jobs: int = 2, log=print, retries: int = 2, overwrite: bool = False
) -> list[RunResult]:
    """Run the specs, `jobs` at a time; logs of each run in `<run_dir>.log`.

    Each spec's folder is handled by `action` (call it on every spec first to refuse a bad
    folder before anything runs); `overwrite` lets runs with other settings be run again.
    A failed run is started again up to `retries` times, after the others that were waiting.
    """
    if jobs < 1:
        raise ValueError(f"run_all: jobs must be >= 1, got {jobs}")
    pending, running, results = list(specs), [], []
    tries: dict[Path, int] = {}
    while pending or running:
        while pending and len(running) < jobs:
            spec = pending.pop(0)
            what = action(spec, overwrite)
            if what == "keep":
                results.append(RunResult(spec, 0, _kept_seconds(spec), reused=True))
                log(f"kept   {spec.name} seed {spec.seed} (finished before, same settings)")
                continue
            spec.run_dir.parent.mkdir(parents=True, exist_ok=True)
            log_fd = open_nofollow(
                Path(f"{spec.run_dir}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            )
            handle = os.fdopen(log_fd, "w")  # safe-write: fd (open_nofollow); closed at the end
            proc = subprocess.Popen(
                _command(spec, what in ("restart", "rerun")),
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=run_env(),
            )
            running.append((spec, proc, handle, time.perf_counter(), provenance.snapshot()))
            log(f"start  {spec.name} seed {spec.seed}" + ("" if what == "run" else f" ({what})"))
        time.sleep(2.0)
        for item in list(running):
            spec, proc, handle, t0, start = item
            if proc.poll() is None:
                continue
            handle.close()
            running.remove(item)
            seconds = time.perf_counter() - t0
            if proc.returncode and tries.get(spec.run_dir, 0) < retries:
                tries[spec.run_dir] = tries.get(spec.run_dir, 0) + 1
                log(f"retry  {spec.name} seed {spec.seed} (rc {proc.returncode}, see "
                    f"{spec.run_dir}.failed-{tries[spec.run_dir]}.log)")  # fmt: skip
                failed = Path(f"{spec.run_dir}.failed-{tries[spec.run_dir]}.log")
                refuse_link(failed)
                os.replace(f"{spec.run_dir}.log", failed)  # safe-write: rename
                pending.append(spec)
                continue
            results.append(RunResult(spec, proc.returncode, seconds, reused=False))
            if spec.run_dir.is_dir() and proc.returncode == 0:
                write_atomic(
                    spec.run_dir / "study_wall_seconds.json", json.dumps({"seconds": seconds})
                )
                record = {"seconds": seconds, "start": start, "end": provenance.snapshot()}
                write_atomic(spec.run_dir / PROVENANCE, json.dumps(record, indent=1) + "\n")
            state = "done  " if proc.returncode == 0 else f"FAILED (rc {proc.returncode}, see "
            state += "" if proc.returncode == 0 else f"{spec.run_dir}.log)"
            log(f"{state} {spec.name} seed {spec.seed} in {seconds:.0f} s")
    return results


def run_env() -> dict[str, str]:
    """The runs' environment: Ray's actors at normal priority (`RAY_worker_niceness=0`).

    Ray starts worker processes at niceness 15 by default; on a shared machine that lets any
    other job starve the study's trainer and rollout actors and makes wall times meaningless.
    An explicit `RAY_worker_niceness` in the caller's environment is kept.
    """
    env = dict(os.environ)
    env.setdefault("RAY_worker_niceness", "0")
    return env


def _kept_seconds(spec: RunSpec) -> float:
    path = spec.run_dir / "study_wall_seconds.json"
    return json.loads(path.read_text())["seconds"] if path.exists() else float("nan")
