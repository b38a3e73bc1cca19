"""Run every (recipe, seed) of the study as its own `nemo_fp8_rl.train` process.

Runs go to `<out>/<recipe name>/seed-<k>` with `grpo.seed=k`; at most `jobs` at a time, ordered
recipe by recipe so that the first runs of each seed build its cached warm-up and the other
recipes of that seed reuse it. A finished run (its `metrics.jsonl` reaches
`grpo.max_num_steps`) is kept and not run again; a failed run is reported and the others go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nemo_fp8_rl.config import load_recipe


@dataclass(frozen=True)
class RunSpec:
    """One study run: a recipe file, a seed and where it writes."""

    recipe: Path
    name: str
    seed: int
    run_dir: Path
    steps: int
    overrides: tuple[str, ...] = ()


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
    """The (recipe, seed) runs in launch order (recipe-major); `overrides` go to every run."""
    specs = []
    for path in recipes:
        recipe = load_recipe(path, list(overrides))
        steps = recipe.config["grpo"]["max_num_steps"]
        for seed in seeds:
            run_dir = out / recipe.name / f"seed-{seed}"
            specs.append(RunSpec(path, recipe.name, seed, run_dir, steps, tuple(overrides)))
    return specs


def finished(spec: RunSpec) -> bool:
    """True when the run directory holds metrics up to the last step of the same seed."""
    metrics = spec.run_dir / "metrics.jsonl"
    if not metrics.exists():
        return False
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return bool(lines) and lines[-1]["step"] >= spec.steps


def _command(spec: RunSpec) -> list[str]:
    return [
        sys.executable, "-m", "nemo_fp8_rl.train", "--recipe", str(spec.recipe),
        "--run-dir", str(spec.run_dir), "--no-progress", f"grpo.seed={spec.seed}", *spec.overrides,
    ]  # fmt: skip


def run_all(specs: list[RunSpec], jobs: int = 2, log=print, retries: int = 1) -> list[RunResult]:
    """Run the specs, `jobs` at a time; logs of each run in `<run_dir>.log`.

    A failed run is started again up to `retries` times (from scratch, after the others that
    were waiting): on a loaded machine Ray's node start can time out, which says nothing about
    the recipe; a real failure fails again and is reported.
    """
    pending, running, results = list(specs), [], []
    tries: dict[Path, int] = {}
    while pending or running:
        while pending and len(running) < jobs:
            spec = pending.pop(0)
            if finished(spec):
                results.append(RunResult(spec, 0, _kept_seconds(spec), reused=True))
                log(f"kept   {spec.name} seed {spec.seed} (finished before)")
                continue
            spec.run_dir.parent.mkdir(parents=True, exist_ok=True)
            if spec.run_dir.exists() and not finished(spec):
                _clear(spec.run_dir)
            handle = open(f"{spec.run_dir}.log", "w")  # noqa: SIM115 - closed when it ends
            proc = subprocess.Popen(
                _command(spec), stdout=handle, stderr=subprocess.STDOUT, env=run_env()
            )
            running.append((spec, proc, handle, time.perf_counter()))
            log(f"start  {spec.name} seed {spec.seed}")
        time.sleep(2.0)
        for item in list(running):
            spec, proc, handle, t0 = item
            if proc.poll() is None:
                continue
            handle.close()
            running.remove(item)
            seconds = time.perf_counter() - t0
            if proc.returncode and tries.get(spec.run_dir, 0) < retries:
                tries[spec.run_dir] = tries.get(spec.run_dir, 0) + 1
                log(
                    f"retry  {spec.name} seed {spec.seed} (rc {proc.returncode}, see {spec.run_dir}.log)"
                )
                os.replace(
                    f"{spec.run_dir}.log", f"{spec.run_dir}.failed-{tries[spec.run_dir]}.log"
                )
                pending.append(spec)
                continue
            results.append(RunResult(spec, proc.returncode, seconds, reused=False))
            if spec.run_dir.is_dir():
                (spec.run_dir / "study_wall_seconds.json").write_text(
                    json.dumps({"seconds": seconds})
                )
            state = (
                "done  "
                if proc.returncode == 0
                else f"FAILED (rc {proc.returncode}, see {spec.run_dir}.log)"
            )
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


def _clear(run_dir: Path) -> None:
    """Remove an unfinished run directory (it restarts from scratch)."""
    import shutil

    shutil.rmtree(run_dir)
