"""NeMo RL's real GRPO loop on CPU, run as a user runs it: `nemo_fp8_rl.train --engine nemo`.

NeMo RL's `grpo.setup` and `grpo_train`, `Policy`, `RayWorkerGroup`, `RayVirtualCluster`,
`VllmGeneration`, `ResponseDataset`, math environment, checkpoint manager and logger run as
shipped on a real local Ray; the project's loss, `ShadowPolicy` and calibrator run inside them.
Stood in (`engines.nemo.cpu.stand_ins`): the Megatron and vLLM workers (CPU ones on real
megatron-core and transformers), CUDA IPC handles, and Ray's start (one logical GPU).

Each run is a child process of the real CLI. The 5-step run is in the contract suite; the
10-step run, the faults (a generation worker killed after a checkpoint, then `--resume`; a
refit stream that disagrees with its metadata) and asynchronous GRPO (NeMo RL's
`async_grpo_train`, its collector and replay buffer, the collective refit over gloo) are `slow`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]
RECIPE = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8"
HANG_S = 2400  # a hung run, not a slow one: a loaded 2-core machine is slow


ASYNC_RECIPE = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-async-1off-fp8"


def _command(run_dir: Path, *extra: str, recipe: str = RECIPE) -> list[str]:
    return [
        sys.executable, "-m", "nemo_fp8_rl.cli.train", "--recipe", recipe, "--engine", "nemo",
        "--run-dir", str(run_dir), "--no-progress", *extra,
    ]  # fmt: skip


def _env(tag: str = "", **extra: str) -> dict[str, str]:
    """This environment (NeMo RL's tree on PYTHONPATH), tagged so the test finds its actors."""
    return {**os.environ, "NEMO_FP8_RL_TEST_TAG": tag, **extra}


def train(
    run_dir: Path, *extra: str, env: dict[str, str] | None = None, recipe: str = RECIPE
) -> subprocess.CompletedProcess:
    """Run the CLI to completion; its output is kept for the failure message."""
    return subprocess.run(
        _command(run_dir, *extra, recipe=recipe),
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train_rows(run_dir: Path) -> dict[int, dict]:
    """Per step: the merged `train/*` metrics NeMo RL's logger received."""
    out: dict[int, dict] = {}
    for row in rows(run_dir):
        if any(k.startswith("train/") for k in row):
            out.setdefault(row["step"], {}).update(row)
    return out


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    )


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("loop") / "run"
    proc = train(run_dir, "grpo.max_num_steps=5")
    ok(proc)
    (run_dir.parent / "train.out").write_text(proc.stdout)
    return run_dir


def test_the_guard_rails_count_the_served_layers_and_judge_the_health(five_steps: Path) -> None:
    """The served-precision check reached the CPU generation worker actor at step 0 and after
    the first refit (NeMo RL's patches in place, every decoder linear block FP8 but, on real
    vLLM, the fused q/k/v the recipe keeps BF16), and the closing summary judged the run's
    mismatch (docs/guard-rails.md)."""
    out = (five_steps.parent / "train.out").read_text()
    real_vllm = "generation: NeMo RL's vLLM worker" in out
    for when in ("step 0", "after refit 1"):
        line = next(x for x in out.splitlines() if x.startswith(f"served-precision ({when}):"))
        assert re.search(r"\d+ fp8-block; NeMo RL FP8 patches in place$", line), line
        if real_vllm:  # the fused q/k/v of each decoder layer, kept BF16 (not whole FP8 blocks)
            assert re.search(r": 2 bf16, \d+ fp8-block;", line), line
        else:
            assert "bf16" not in line
    assert "health (fp8, over all steps):" in out


def test_the_loop_takes_its_steps_with_the_projects_metrics(five_steps: Path) -> None:
    steps = train_rows(five_steps)
    assert sorted(steps) == [1, 2, 3, 4, 5]
    for k, row in steps.items():
        for key in ("train/clip_lower_frac_neg", "train/clip_upper_frac_pos", "train/loss"):
            assert key in row, f"step {k}: {key} missing from {sorted(row)}"
    handed = (five_steps / "nemo_rl_config.yaml").read_text()
    assert "gpus_per_node: 1" in handed and "nemo-inputs/model" in handed
    env = json.loads((five_steps / "environment.json").read_text())
    assert env["engine"] == "nemo"
    real_vllm = "generation: NeMo RL's vLLM worker" in (five_steps.parent / "train.out").read_text()
    assert env["generator"]["backend"] == ("vllm" if real_vllm else "stand-in")
    assert env["generator"]["reason"] and (env["generator"]["version"] is not None) == real_vllm
    assert len(env["nemo_rl_tree"]["source_sha256"]) == 64  # the tree compare checks
    seconds = env["seconds"]
    for stage in ("handoff", "ray_start", "tokenizer_and_data", "setup_and_training", "total"):
        assert seconds[stage] >= 0, seconds
    for k, row in steps.items():
        assert row["system/load_average_1min"] >= 0, f"step {k}: no load average"


def test_calibration_runs_every_two_steps_and_its_state_is_checkpointed(five_steps: Path) -> None:
    steps = train_rows(five_steps)
    shadow = [k for k, row in steps.items() if any("shadow" in key for key in row)]
    assert shadow, f"no shadow metrics in {sorted(steps[1])}"
    ckpt = five_steps / "checkpoints" / "step_5"
    assert ckpt.is_dir(), sorted(p.name for p in (five_steps / "checkpoints").iterdir())
    saved = list(ckpt.rglob("*calibrat*"))
    assert saved, f"no calibrator state under {ckpt}"


# ---- the 10-step loop and its faults (slow) -------------------------------------------------

TIMING = ("timing/", "performance/", "system/")  # wall-clock and load: differ run to run


def values(run_dir: Path, first_step: int = 0) -> dict[tuple[int, str], object]:
    """Every non-timing value NeMo RL's logger received, by (step, name), from `first_step`."""
    return {
        (row["step"], k): v
        for row in rows(run_dir)
        if row["step"] >= first_step
        for k, v in row.items()
        if k != "step" and not k.startswith(TIMING)
    }


def actor_pids(tag: str, actor: str) -> list[int]:
    """Processes of this test's Ray whose title names `actor` (Ray titles them `ray::<Class>`)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"NEMO_FP8_RL_TEST_TAG={tag}".encode() in environ and actor.encode() in cmdline:
            found.append(int(proc.name))
    return found


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {path}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(1.0)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("loop10") / "run"
    ok(train(run_dir))
    return run_dir


NOISE = 1e-9  # the bounds NeMo RL's logger receives carry float round-off between steps


def calibrations(run_dir: Path) -> dict[str, list[int]]:
    """The calibration steps of a run (rows carrying `train/calib_skipped`) by outcome. A
    calibration at step k sets the bounds in force from step k + 1 (`train/calib_low`,
    `calib_high` are the bounds a step trained with), so it `moved` them when step k + 1's
    differ from step k's beyond round-off; `skipped`: counted as skipped (too few tokens);
    `held`: it ran, and its lower target lies at or above the nominal lower bound, which the
    relax-only lower bound cannot pass (the bounds stay)."""
    import yaml

    loss = yaml.safe_load((run_dir / "nemo_rl_config.yaml").read_text())["loss_fn"]
    nominal_low = 1.0 - loss["ratio_clip_min"]
    steps = train_rows(run_dir)
    bounds = {k: (row["train/calib_low"], row["train/calib_high"]) for k, row in steps.items()}
    out: dict[str, list[int]] = {"calibrated": [], "moved": [], "skipped": [], "held": []}
    for k in sorted(k for k, row in steps.items() if "train/calib_skipped" in row):
        out["calibrated"].append(k)
        if steps[k]["train/calib_skipped"] == 1.0:
            out["skipped"].append(k)
        if k + 1 in bounds and any(
            abs(a - b) > NOISE for a, b in zip(bounds[k + 1], bounds[k], strict=True)
        ):
            out["moved"].append(k)
        elif steps[k]["train/calib_skipped"] == 0.0 and (
            steps[k].get("train/calib_low_target", 0.0) >= nominal_low - NOISE
        ):
            out["held"].append(k)
    return out


@pytest.mark.slow
def test_ten_steps_calibrate_five_times(ten_steps: Path) -> None:
    """Calibration every 2 steps from step 1: five calibrations, each of which moved the bounds,
    was counted as skipped, or held them at the nominal lower bound its target lay beyond
    (exactly one of these), and at least one moved them."""
    steps = train_rows(ten_steps)
    assert sorted(steps) == list(range(1, 11))
    found = calibrations(ten_steps)
    named = ", ".join(f"{k} {v}" for k, v in found.items())
    assert found["calibrated"] == [1, 3, 5, 7, 9], named
    outcomes = found["moved"] + found["skipped"] + found["held"]
    assert sorted(outcomes) == found["calibrated"], named
    assert found["moved"], named


def step_rows(run_dir: Path) -> list[int]:
    """The step of each metric row of `metrics.jsonl` (health events left out), in order."""
    return [row["step"] for row in rows(run_dir) if "event" not in row]


KEEP = "logger.tensorboard_enabled=false"  # not resumable, and no value the loop logs changes


@pytest.mark.slow
@pytest.mark.parametrize("actor", ["GenerationWorker", "PolicyWorker"])
def test_a_killed_worker_is_located_and_the_printed_resume_reproduces_the_run(
    ten_steps: Path, tmp_path: Path, actor: str
) -> None:
    """Kill -9 the generation actor (real vLLM or the stand-in) or the trainer once step 5 is
    checkpointed: the run ends with the located error (exit 1) naming step_5, which is left as
    it was, and `metrics.jsonl` holds one row per completed step; the resume command it prints
    (the run's overrides included: without them the resume is refused as another recipe), run
    as printed, trains steps 6-10 exactly as the uninterrupted run did (every non-timing value
    NeMo RL logged is equal), one row per step."""
    run_dir, tag = tmp_path / "run", uuid.uuid4().hex
    proc = subprocess.Popen(
        _command(run_dir, KEEP), env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        step5 = run_dir / "checkpoints" / "step_5"
        wait_for(step5 / "training_info.json", proc)
        kept = snapshot(step5)
        pids = actor_pids(tag, actor)
        assert pids, f"no {actor} actor found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert error and "NeMo RL's loop stopped" in error[-1] and "step_5" in error[-1], err[-4000:]
    assert snapshot(step5) == kept
    steps = step_rows(run_dir)
    assert steps == sorted(set(steps)) and set(range(1, 6)) <= set(steps), steps
    assert all("train/loss" in r for r in rows(run_dir) if r["step"] > 0 and "event" not in r)
    printed = error[-1].split("resume with `", 1)[1].split("`", 1)[0]
    assert KEEP in printed and printed.endswith("--resume"), printed
    ok(subprocess.run(shlex.split(printed), env=_env(), capture_output=True, text=True,
                      timeout=HANG_S))  # fmt: skip
    assert step_rows(run_dir) == step_rows(ten_steps)  # one row per step, none twice
    full, resumed = values(ten_steps, 6), values(run_dir, 6)
    assert sorted({k for k, _ in resumed}) == [6, 7, 8, 9, 10]
    assert resumed.keys() == full.keys()
    both_nan = lambda a, b: a != a and b != b  # noqa: E731  (NaN equals nothing)
    differ = [k for k in full if full[k] != resumed[k] and not both_nan(full[k], resumed[k])]
    assert not differ, [(k, full[k], resumed[k]) for k in differ[:10]]


BAD_REFIT = """
import sys, torch
from nemo_rl.algorithms import grpo
original, calls = grpo.refit_policy_generation, []

def refit(policy, policy_generation, *args, **kwargs):
    calls.append(1)
    if len(calls) == 3:  # the fault: the generator is told a weight has another shape
        info = policy.prepare_refit_info()
        name = next(n for n in info if n.endswith("mlp.down_proj.weight"))
        shape, dtype = info[name]
        info[name] = (torch.Size([shape[0], shape[1] + 1]), dtype)
        policy_generation.prepare_refit_info(info)
    return original(policy, policy_generation, *args, **kwargs)

grpo.refit_policy_generation = refit
import os
from nemo_fp8_rl.runs.ray_exit import CHILD
os.environ[CHILD] = "1"  # train in this process (a supervised child would not have the fault)
from nemo_fp8_rl.cli.train import entry
sys.argv = ["nemo_fp8_rl.train", *sys.argv[1:]]
entry()
"""


@pytest.mark.slow
def test_a_refit_whose_metadata_disagrees_with_the_model_is_refused_on_the_running_loop(
    tmp_path: Path,
) -> None:
    """At the third refit the generation worker is handed metadata that disagrees with its
    model: it refuses before any weight moves, and the run ends with the located error."""
    script = tmp_path / "bad_refit.py"
    script.write_text(BAD_REFIT)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(script), *_command(run_dir)[3:]]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")][-1]
    assert "prepare_refit_info" in error and "down_proj" in error, error
    assert sorted(train_rows(run_dir)) == [1, 2]


@pytest.mark.slow
def test_trainer_quantized_refit_runs_the_loop(tmp_path: Path) -> None:
    """`refit.quantize_on: trainer`: the policy worker sends FP8 pairs, the generation worker's
    extension loads them as sent (its metadata check first); four steps with calibration."""
    run_dir = tmp_path / "run"
    proc = train(run_dir, "refit.quantize_on=trainer", "grpo.max_num_steps=4",
                 "checkpointing.save_period=4")  # fmt: skip
    ok(proc)
    assert "TrainerFp8" in proc.stdout or "TrainerFp8" in proc.stderr
    steps = train_rows(run_dir)
    assert sorted(steps) == [1, 2, 3, 4]
    assert all(row["train/loss"] == row["train/loss"] for row in steps.values())  # finite
    assert "quantize_on: trainer" in (run_dir / "recipe.yaml").read_text()  # as run


@pytest.mark.slow
def test_async_grpo_shadow_observations_reach_the_calibrator(tmp_path: Path) -> None:
    """NeMo RL's `async_grpo_train` (trajectories one step old, generation on its own logical
    GPU through the async engine, refit by the collective path): the shadow passes of steps 1
    and 3 reach the calibrator, which moves the bounds, and its state is checkpointed."""
    run_dir = tmp_path / "run"
    proc = train(
        run_dir, "grpo.max_num_steps=4", "checkpointing.save_period=4", recipe=ASYNC_RECIPE
    )
    ok(proc)
    assert "Starting async GRPO training" in proc.stdout, proc.stdout[-3000:]
    steps = train_rows(run_dir)
    assert sorted(steps) == [1, 2, 3, 4]
    assert [steps[k]["train/avg_trajectory_age"] for k in (2, 3, 4)] == [1.0, 1.0, 1.0]
    shadowed = sorted(k for k, row in steps.items() if row.get("train/shadow_tokens", 0) > 0)
    assert shadowed == [1, 3], shadowed
    first = steps[1]
    assert first["train/calib_n_neg"] > 0 and first["train/calib_low_pool_windows"] >= 1
    assert steps[4]["train/calib_low"] != 0.8 or steps[4]["train/calib_high"] != 1.2, steps[4]
    handed = (run_dir / "nemo_rl_config.yaml").read_text()
    assert "async_engine: true" in handed and "gpus_per_node: 2" in handed
    assert list((run_dir / "checkpoints" / "step_4").rglob("*calibrat*"))
