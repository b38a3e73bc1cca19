"""The command a stopped run prints to continue, and the metric rows a resumed run keeps.

The printed command is parsed by `nemo_fp8_rl.train`'s own parser and loaded as `train` loads it:
the resumed recipe must be the run's recipe, overrides included (`rundir.check_owner` refuses a
resume whose settings differ). `metrics.jsonl` holds one row per completed step on both engines:
the NeMo RL engine's tee writes a step's row only when NeMo RL finishes the step, and a resume
drops the rows of the steps it trains again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from nemo_fp8_rl.cli.train import _parser
from nemo_fp8_rl.config.nemo_import import load_recipe_or_import
from nemo_fp8_rl.engines.local import faults as local_faults
from nemo_fp8_rl.engines.local.checkpoint import save_checkpoint
from nemo_fp8_rl.engines.nemo.driver import worker_faults
from nemo_fp8_rl.engines.nemo.driver.metrics_log import MetricsTee
from nemo_fp8_rl.engines.nemo.driver.runner import checkpoint_step
from nemo_fp8_rl.runs.resume import keep_completed_rows, train_argv, train_command

RECIPE = "tiny/grpo-tiny-qwen3-cpu-fp8"
OVERRIDES = ["grpo.max_num_steps=7", "loss_fn.ratio_clip_min=0.15", "logger.wandb.project=a b"]


def _recipe(tmp_path: Path):
    return load_recipe_or_import(RECIPE, OVERRIDES, run_dir=tmp_path / "run")


def _printed(error: str) -> str:
    """The command an error line prints to continue the run (between backquotes)."""
    return error.split("resume with `", 1)[1].split("`", 1)[0]


def _parsed(line: str):
    """The printed line as `nemo_fp8_rl.train` receives it (its prefix left off)."""
    words = shlex.split(line)
    return _parser().parse_intermixed_args(words[words.index("--recipe") :])


def test_the_printed_resume_command_loads_the_run_s_own_recipe(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    line = train_command(recipe, "local")
    args = _parsed(line)
    assert args.resume and not args.overwrite and args.engine == "local"
    assert args.recipe == RECIPE and args.overrides == OVERRIDES  # as given, in order
    again = load_recipe_or_import(args.recipe, args.overrides, run_dir=args.run_dir)
    assert again.config == recipe.config and again.run_dir == recipe.run_dir
    plain = load_recipe_or_import(RECIPE, [], run_dir=tmp_path / "run")
    assert plain.config != recipe.config  # what the old command (no overrides) resumed


def test_start_over_command_carries_overwrite_instead(tmp_path: Path) -> None:
    argv = train_argv(_recipe(tmp_path), "nemo", "--overwrite")
    args = _parser().parse_intermixed_args(argv)
    assert args.overwrite and not args.resume and args.engine == "nemo"
    assert argv[-1] == "--overwrite" and argv[-1 - len(OVERRIDES) : -1] == OVERRIDES


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_keep_completed_rows_drops_the_steps_a_resume_trains_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": k, "train/loss": k / 10} for k in range(6)]
    rows.insert(4, {"step": 3, "event": {"metric": "x"}})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert keep_completed_rows(path, 3) == 2
    assert [r["step"] for r in _lines(path)] == [0, 1, 2, 3, 3]
    assert keep_completed_rows(path, 3) == 0
    assert keep_completed_rows(path, 0) == 5 and path.read_text() == ""
    assert keep_completed_rows(tmp_path / "missing.jsonl", 2) == 0
    assert not (tmp_path / "missing.jsonl").exists()


def test_checkpoint_step_reads_nemo_rls_folder_name() -> None:
    assert checkpoint_step("/x/checkpoints/step_12") == 12
    assert checkpoint_step(None) == 0 and checkpoint_step("/x/tmp_step_3") == 0


class _NemoLogger:
    """Records NeMo RL's `Logger.log_metrics` calls (its backends are not needed here)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_metrics(self, metrics, step, prefix="", step_metric=None, step_finished=False):
        self.calls.append((step, prefix, step_finished))


def _nemo_step(tee: MetricsTee, step: int, *, finish: bool = True) -> None:
    """One step as `grpo_train` logs it: rollout metrics as `train` first (before training),
    then the step's `train` metrics and its timings, the last call finishing the step."""
    tee.log_metrics({"mean_gen_tokens_per_sample": 4.0}, step, prefix="train")
    if finish:
        tee.log_metrics({"loss": 0.1 * step}, step, prefix="train")
        tee.log_metrics({"total_step_time": 1.0}, step, "timing/train", step_finished=True)


def test_a_killed_nemo_step_leaves_no_row_and_a_resume_none_twice(tmp_path: Path) -> None:
    """Killed inside step 4 (after its rollout was logged), checkpoint at step 2: the file
    holds steps 0-3, one row each; the resume drops 3 and trains 3 and 4 again, once each."""
    path = tmp_path / "metrics.jsonl"
    tee = MetricsTee(_NemoLogger(), path)
    tee.log_metrics({"accuracy": 0.5}, 0, "validation")  # val_at_start: no finishing call
    for step in (1, 2, 3):
        _nemo_step(tee, step)
    _nemo_step(tee, 4, finish=False)  # the process dies here: nothing more is written
    assert [r["step"] for r in _lines(path)] == [0, 1, 2, 3]
    assert all("train/loss" in r for r in _lines(path)[1:])
    keep_completed_rows(path, checkpoint_step(tmp_path / "checkpoints" / "step_2"))
    resumed = MetricsTee(_NemoLogger(), path)
    for step in (3, 4, 5):
        _nemo_step(resumed, step)
    resumed.finish()
    assert [r["step"] for r in _lines(path)] == [0, 1, 2, 3, 4, 5]


def _trainer_death(class_name: str):
    import ray.exceptions as rex

    text = f"{rex.ActorDiedError.BASE_ERROR_MSG}\n\tclass_name: {class_name}\n\tactor_id: ab12"
    return rex.RayActorError(error_msg=text)


def test_an_embedded_actor_s_death_prints_the_run_s_resume_command(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    fault = local_faults.located(_trainer_death("Trainer"), recipe)
    assert fault is not None and "the trainer actor died" in str(fault)
    assert "start again" in fault.fix and fault.fix.endswith("--overwrite`")
    save_checkpoint(Path(recipe.run_dir) / "checkpoints", 2, {"w": 1}, {"recipe": recipe.name})
    fault = local_faults.located(_trainer_death("Rollout"), recipe)
    assert fault is not None and "the rollout actor died" in fault.what
    line = _printed(str(fault))
    assert line == train_command(recipe, "local") and _parsed(line).overrides == OVERRIDES
    assert local_faults.located(ValueError("x"), recipe) is None


def test_a_nemo_worker_s_death_prints_the_run_s_resume_command(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_3").mkdir(parents=True)
    resume, start = train_command(recipe, "nemo"), train_command(recipe, "nemo", "--overwrite")
    death = _trainer_death("MegatronPolicyWorker")
    fault = worker_faults.located(death, recipe.name, str(ckpt), resume, start)
    assert fault is not None and _printed(str(fault)) == resume and "step_3" in fault.fix
    assert _parsed(resume).overrides == OVERRIDES


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_the_flag_is_last_and_once(tmp_path: Path, flag: str) -> None:
    argv = train_argv(_recipe(tmp_path), "local", flag)
    assert argv.count(flag) == 1 and argv[-1] == flag


# ---- a real embedded run: its trainer actor killed, then the printed command run as printed ----

FAST = [
    "grpo.num_prompts_per_step=8",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "grpo.val_period=2",
    "checkpointing.save_period=1",
    "local.warmup.steps=10",
    "local.task.num_validation=16",
    "grpo.max_num_steps=3",
]


def _train(run_dir: Path, env: dict[str, str]):
    import subprocess
    import sys

    script = Path(sys.executable).parent / "nemo_fp8_rl.train"
    args = [str(script), "--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16", "--run-dir", str(run_dir)]
    return subprocess.Popen(
        [*args, "--no-progress", *FAST], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _actor_pids(tag: str, actor: str) -> list[int]:
    """This test's processes (tagged in their environment) whose title names `actor`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes() if proc.name.isdigit() else b""
            cmdline = (proc / "cmdline").read_bytes() if environ else b""
        except OSError:
            continue
        if f"NEMO_FP8_RL_TEST_TAG={tag}".encode() in environ and actor.encode() in cmdline:
            found.append(int(proc.name))
    return found


def _values(run_dir: Path) -> dict[tuple[int, str], object]:
    return {
        (row["step"], k): v
        for row in _lines(run_dir / "metrics.jsonl")
        for k, v in row.items()
        if k != "step" and not k.startswith(("timing/", "throughput/", "system/"))
    }


@pytest.mark.slow
def test_killed_trainer_then_the_printed_command_reproduces_the_run(tmp_path, monkeypatch) -> None:
    """Kill -9 the trainer actor once step 1 is checkpointed: exit 1 with the located error and
    the run's own resume command; run as printed, it trains the rest exactly as the
    uninterrupted run did, and `metrics.jsonl` holds one row per step."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    tag = uuid.uuid4().hex
    env = {**os.environ, "NEMO_FP8_RL_CACHE": str(tmp_path / "cache"), "NEMO_FP8_RL_TEST_TAG": tag}
    env.pop("RAY_ADDRESS", None)
    full = _train(tmp_path / "full", env)
    assert full.wait(timeout=1800) == 0, full.stderr.read()
    killed = _train(tmp_path / "part", env)
    latest, deadline = tmp_path / "part/checkpoints/latest", time.time() + 1800
    while not (latest.exists() and latest.read_text().strip() == "step_1"):
        assert killed.poll() is None and time.time() < deadline, killed.stderr.read()
        time.sleep(0.2)
    pids = _actor_pids(tag, "Trainer")
    assert pids, "no trainer actor found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _, err = killed.communicate(timeout=600)
    assert killed.returncode == 1, err[-4000:]
    error = [line for line in err.splitlines() if line.startswith("error:")][-1]
    assert "the trainer actor died" in error and "resume with `" in error, error
    printed = _printed(error)
    again = subprocess.run(shlex.split(printed), env=env, capture_output=True, text=True,
                           timeout=1800)  # fmt: skip
    assert again.returncode == 0, again.stderr[-4000:]
    steps = [r["step"] for r in _lines(tmp_path / "part/metrics.jsonl") if "event" not in r]
    assert steps == sorted(set(steps)) and steps[-3:] == [1, 2, 3]
    assert _values(tmp_path / "part") == _values(tmp_path / "full")


def test_a_refit_death_names_the_dead_vllm_actor(tmp_path: Path) -> None:
    """A vLLM actor killed inside a refit surfaces as the trainer's error (its ZeroMQ send
    times out); the located error names the actor found dead, then where the loop stopped."""
    import ray.exceptions as rex

    recipe = _recipe(tmp_path)
    timeout = rex.RayTaskError(
        "stream_weights_via_ipc_zmq",
        "Traceback (most recent call last): ...",
        TimeoutError("zmq send timed out after 120 s"),
        proctitle="ray::CpuMegatronPolicyWorker.stream_weights_via_ipc_zmq",
    )
    args = (recipe.name, str(tmp_path / "ckpt"), "resume", "start")
    fault = worker_faults.located(timeout, *args, dead=["CpuVllmGenerationWorker"])
    assert fault is not None and fault.where.endswith(": CpuVllmGenerationWorker"), str(fault)
    assert "the actor died" in fault.what and "stream_weights_via_ipc_zmq" in fault.what
    alone = worker_faults.located(timeout, *args, dead=[])
    assert alone is not None and alone.where.endswith(": stream_weights_via_ipc_zmq")
    assert worker_faults.dead_workers((object(),)) == []  # no worker group: nothing probed
