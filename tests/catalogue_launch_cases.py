"""Catalogue cases for launching and restarting runs: run directories, seeds, Ray's address and
the logging backends of the embedded engine.

Same `Case` format as `catalogue_cases` (run by `test_catalogue_launch.py` with the harness of
`test_catalogue.py`). None of these starts Ray: the refusals happen before it, and the one
accepted training case (`resume-finished`) finds nothing to train.
"""

from __future__ import annotations

import json

from catalogue_cases import BF16, Case, Workspace

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.runs import rundir

T = "tiny/grpo-tiny-qwen3-cpu-bf16"
RUN = ("--recipe", T, "--run-dir", "{ws}/run")
SEEDS = ("--recipe", T, "--run-dir", "{ws}/group")
TWO = "grpo.max_num_steps=2"


def never_started(ws: Workspace, rel: str = "run", overrides: tuple[str, ...] = ()) -> None:
    """A run dir as a run leaves it when Ray did not start after the warm-up: recipe.yaml, the
    warm-started model, a step-0 metrics line, no checkpoint."""
    run_dir = ws.root / rel
    r = load_recipe(BF16, list(overrides), run_dir=run_dir)
    rundir.prepare(run_dir, r.config, r.to_yaml(with_sources=True), resume=False)
    ws.write(f"{rel}/model/config.json", "{}")
    ws.write(f"{rel}/metrics.jsonl", json.dumps({"step": 0, "warmup/steps": 5.0}) + "\n")


def _seed(ws: Workspace, seed: int, steps: tuple[int, ...], max_steps: int = 2) -> None:
    """`group/seed-<seed>`: a run of that seed with checkpoints at `steps`."""
    ws.run(
        f"group/seed-{seed}",
        overrides=(f"grpo.seed={seed}", f"grpo.max_num_steps={max_steps}"),
        steps=steps,
    )


# fmt: off
CASES: list[Case] = [
    # ---- restarting a run -------------------------------------------------------------------
    Case("rerun-logged-no-checkpoint", "train", RUN, 2, "logged 2 step(s) but saved no checkpoint to continue from; nothing was written. Fix: pass --overwrite", lambda ws: ws.run(steps=())),
    Case("rerun-with-checkpoint", "train", RUN, 2, "Fix: pass --resume to continue it, --overwrite to start it over", lambda ws: ws.run()),
    Case("resume-finished", "train", (*RUN, "--resume", TWO), 0, "already completed all 2 steps (step_2); nothing to train", lambda ws: ws.run(overrides=(TWO,)), stdout="nothing to train"),
    Case("single-run-over-seeds", "train", ("--recipe", T, "--run-dir", "{ws}/group"), 2, "holds a multi-seed run (seed-1), made by --seeds; nothing was written. Fix: add --seeds", lambda ws: _seed(ws, 1, (2,))),
    Case("single-run-over-seeds-json", "train", ("--recipe", T, "--run-dir", "{ws}/group"), 2, "holds a multi-seed run (seeds.json)", lambda ws: ws.write("group/seeds.json", '{"seeds": []}')),
    # ---- --seeds ------------------------------------------------------------------------------
    Case("seeds-over-single-run", "train", (*SEEDS, "--seeds", "1-2", "--dry-run"), 2, "holds a single-seed run (recipe.yaml), and --seeds would put seed-<k>/ folders inside it", lambda ws: ws.run("group")),
    Case("seeds-over-never-started-single-run", "train", (*SEEDS, "--seeds", "1-2", "--dry-run"), 2, "holds a single-seed run", lambda ws: never_started(ws, "group")),
    Case("seeds-run-dir-file", "train", (*SEEDS, "--seeds", "1-2", "--dry-run"), 2, "group: is a file, not a folder", lambda ws: ws.write("group", "x")),
    Case("seeds-cap-train", "train", ("--recipe", T, "--seeds", "1-100000", "--dry-run"), 2, "more than 1000 seeds in one launch"),
    Case("seeds-cap-submit", "submit", ("--recipe", T, "--seeds", "1-100000", "--dry-run"), 2, "more than 1000 seeds in one launch"),
    Case("seeds-cap-many-items", "train", ("--recipe", T, "--seeds", "1-600,1000-1600", "--dry-run"), 2, "more than 1000 seeds"),
    Case("parallel-without-seeds", "train", ("--recipe", T, "--parallel", "4", "--dry-run"), 2, "--parallel sets how many seeds train at once; add --seeds"),
    Case("seeds-foreign-summary", "train", (*SEEDS, "--seeds", "1", "--resume", "--dry-run"), 2, "seeds.json: not a seeds summary written by --seeds", lambda ws: ws.write("group/seeds.json", '{"runs": [1, 2]}')),
    Case("seeds-partial-needs-resume", "train", (*SEEDS, "--seeds", "1-2", "--dry-run", TWO), 2, "seed-2: already holds a run of 'grpo-tiny-qwen3-cpu-bf16'; nothing was written. Fix: pass --resume", lambda ws: _seed(ws, 2, (1,))),
    Case("seeds-partial-resume-plan", "train", (*SEEDS, "--seeds", "1-2", "--resume", "--dry-run", TWO), 0, "", lambda ws: _seed(ws, 2, (1,)), stdout="seed-2 --engine local --no-progress --resume"),
    Case("seeds-finished-kept", "train", (*SEEDS, "--seeds", "1-2", "--dry-run", TWO), 0, "", lambda ws: _seed(ws, 1, (2,)), stdout="1 seed(s) of group on the local engine, 1 at a time; kept (finished before): 1"),
    Case("seeds-never-started-plain-rerun", "train", (*SEEDS, "--seeds", "1-2", "--dry-run", TWO), 0, "", lambda ws: (_seed(ws, 1, (2,)), never_started(ws, "group/seed-2", ("grpo.seed=2", TWO))), stdout="kept (finished before): 1"),
    # ---- Ray's address and the logging backends -----------------------------------------------
    Case("dead-ray-address", "train", RUN, 1, "Ray (RAY_ADDRESS=127.0.0.1:1): nothing answers at 127.0.0.1:1", env={"RAY_ADDRESS": "127.0.0.1:1"}, subprocess=True),
    Case("ray-address-bad-port", "train", RUN, 1, "'x' is not a port number", env={"RAY_ADDRESS": "127.0.0.1:x"}),
    Case("swanlab-on-cpu", "train", (*RUN, "logger.swanlab_enabled=true"), 2, "does not carry SwanLab"),
]
# fmt: on
