"""Launching and restarting: every case of `catalogue_launch_cases.CASES` ends as expected (the
harness of `test_catalogue.py`), plus what one command line cannot show: the run-dir lock held
by another real process, seeds.json merging, the never-started rule, the real W&B and MLflow
clients writing their run folders, and (slow) real runs: Ray started on a loaded machine,
retried after a failed start, interrupted while starting, and a never-started run rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from catalogue_cases import BF16, Workspace
from catalogue_launch_cases import CASES, never_started
from test_catalogue import MAINS, check_case_output, hf_source, prepare_case, tree_state
from tiny_fast import TWO_STEPS

from nemo_fp8_rl.cli import train
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe, project_root
from nemo_fp8_rl.engines.local import check_run_dir
from nemo_fp8_rl.runs import lock, rundir
from nemo_fp8_rl.runs.seeds import SeedOutcome, parse_seeds, read_summary, write_summary

__all__ = ["hf_source"]  # the session fixture, shared with test_catalogue.py
T = "tiny/grpo-tiny-qwen3-cpu-bf16"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_catalogue_launch(case, tmp_path, hf_source, monkeypatch, capsys) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    capsys.readouterr()
    before = tree_state(ws)
    code = invoke(MAINS[case.command], argv, prog=f"nemo_fp8_rl.{case.command}")
    captured = capsys.readouterr()
    check_case_output(case, code, captured.out, captured.err, ws)
    if not case.changes:
        assert tree_state(ws) == before, "the command changed files"


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_launch_console_script(case, tmp_path, hf_source, monkeypatch) -> None:
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    before = tree_state(ws)
    script = Path(sys.executable).parent / f"nemo_fp8_rl.{case.command}"
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(script), *argv], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    check_case_output(case, proc.returncode, proc.stdout, proc.stderr, ws)
    assert tree_state(ws) == before
    print(f"{case.id}: {time.monotonic() - t0:.1f} s")


# ---- restarting: the never-started rule -------------------------------------------------------


def test_never_started_run_restarts_with_the_same_command(tmp_path) -> None:
    """recipe.yaml + model + a step-0 line: a plain rerun and --resume both start it over."""
    ws = Workspace(tmp_path, lambda: tmp_path)
    never_started(ws)
    recipe = load_recipe(BF16, run_dir=tmp_path / "run")
    rundir.check_owner(tmp_path / "run", recipe.config)  # no flag needed
    rundir.check_owner(tmp_path / "run", load_recipe(BF16, ["grpo.seed=5"]).config)
    assert check_run_dir(recipe, resume=False, overwrite=False) == (False, None)
    assert check_run_dir(recipe, resume=True, overwrite=False) == (False, None)
    assert not rundir.run_progress(tmp_path / "run").started


def test_progress_counts_garbled_metrics_as_started(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3, "tra')
    assert rundir.run_progress(tmp_path).started


# ---- the run-dir lock -------------------------------------------------------------------------

HOLDER = (
    "import sys, time\nfrom nemo_fp8_rl.runs import lock\nlock.hold(sys.argv[1])\n"
    "print('held', flush=True)\ntime.sleep(300)\n"
)


def test_second_train_in_a_locked_run_dir_is_refused(tmp_path, monkeypatch, capsys) -> None:
    """A real process holds the lock (as a running `train` does): `train --overwrite` into the
    same folder is refused with the holder's pid and writes nothing; once the holder is killed
    (SIGKILL: no clean-up), the lock is free again."""
    ws = Workspace(tmp_path, lambda: tmp_path)
    run_dir = ws.run()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree_state(tmp_path)
        argv = ["--recipe", T, "--run-dir", str(run_dir), "--overwrite", *TWO_STEPS]
        assert invoke(train.main, argv, prog="nemo_fp8_rl.train") == 2
        err = capsys.readouterr().err
        assert f"another training process is running in this folder (pid {holder.pid}" in err
        assert "Fix: wait for it to finish" in err and "nothing was written" in err
        assert tree_state(tmp_path) == before
        with pytest.raises(lock.RunDirBusy):
            lock.hold(run_dir)
    finally:
        holder.kill()
        holder.wait()
    lock.hold(run_dir)
    lock.release(run_dir)


def test_nemo_engine_takes_the_same_run_dir_lock(tmp_path, monkeypatch) -> None:
    """The NeMo RL engine refuses a run dir another process trains in, before it looks for NeMo
    RL or writes anything, and leaves the lock free when it stops."""
    from nemo_fp8_rl.engines.nemo.driver import runner

    run_dir = tmp_path / "gpu-run"
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", run_dir=run_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.RunDirBusy, match=f"pid {holder.pid}"):
            runner.run(recipe)
        assert sorted(p.name for p in run_dir.iterdir()) == [lock.LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()

    def no_nemo_rl():
        raise RuntimeError("no NeMo RL (stand-in for compat.require_supported)")

    monkeypatch.setattr(runner.compat, "require_supported", no_nemo_rl)
    with pytest.raises(RuntimeError, match="stand-in"):
        runner.run(recipe)  # stops after taking the lock; the lock must be free again
    lock.hold(run_dir)
    lock.release(run_dir)


# ---- seeds.json -------------------------------------------------------------------------------


def test_summary_keeps_other_seeds_records(tmp_path) -> None:
    """`--seeds 1-2`, then `--seeds 2 --resume`: seed 1's record stays."""
    write_summary(tmp_path, [SeedOutcome(1, "a", "a.log", 0, 3.0), SeedOutcome(2, "b", "b", -9)])
    write_summary(tmp_path, [SeedOutcome(2, "b", "b.log", 0, 2.0)])
    entries = {e["seed"]: e for e in read_summary(tmp_path)}
    assert entries[1]["returncode"] == 0 and entries[1]["wall_s"] == 3.0
    assert entries[2]["returncode"] == 0


def test_seed_cap_fails_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="more than 1000 seeds"):
        parse_seeds("1-100000000000")
    assert time.monotonic() - t0 < 200  # a hang guard, not a speed check
    assert len(parse_seeds("1-1000")) == 1000


# ---- W&B and MLflow, the real clients ---------------------------------------------------------


def test_wandb_and_mlflow_write_real_run_folders(tmp_path, monkeypatch, capsys) -> None:
    """Both backends on, nobody logged in to W&B: an offline W&B run and an MLflow file store
    in the run dir, holding the logged steps."""
    from nemo_fp8_rl.engines.local.backends import check_available, open_sinks

    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: not logged in
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = ["logger.wandb_enabled=true", "logger.mlflow_enabled=true"]
    cfg = load_recipe(T, overrides, run_dir=tmp_path / "run").config
    check_available(cfg)
    sinks = open_sinks(cfg, tmp_path / "run")
    for step in (1, 2):
        for sink in sinks:
            sink.log(step, {"train/reward": 0.25 * step, "train/nan": float("nan")})
    for sink in sinks:
        sink.close()
    assert "W&B: no login found" in capsys.readouterr().out
    offline = list((tmp_path / "run/logs/wandb/wandb").glob("offline-run-*/*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "run/logs/mlflow").as_uri())
    experiment = client.get_experiment_by_name("nemo-fp8-rl")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "grpo-tiny-qwen3-cpu-bf16" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]


# ---- slow: real launches ----------------------------------------------------------------------


def _train(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "nemo_fp8_rl.train"
    cmd = [str(script), "--recipe", T, "--run-dir", str(run_dir), "--no-progress", *TWO_STEPS]
    return subprocess.run(
        [*cmd, *extra],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_launches_under_load(tmp_path) -> None:
    """Ray, started as the engine starts it, comes up and runs an actor 10 times of 10 while
    the machine is held at load >= 12 (`benchmarks/bench_ray_start.py`: its load holder and its
    light launch, each a fresh process, two at a time as `train --seeds --parallel 2` starts
    them; each counts as load for the other, so the holder burns less). Prints every launch's wait. The full engine launch
    (both actors importing torch) is the same start-up plus minutes of imports at that load;
    the benchmark's default `--kind engine` measures it."""
    out = tmp_path / "launches.json"
    bench = project_root() / "benchmarks/bench_ray_start.py"
    cmd = [sys.executable, str(bench), "--variants", "retry", "--kind", "ray", "--launches", "10"]
    cmd += ["--load", "12", "--concurrent", "2", "--timeout-s", "900", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * 3600)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    rows = json.loads(out.read_text())
    assert len(rows) == 10 and all(r["ok"] for r in rows), proc.stdout[-3000:]
    assert sorted(r["load"] for r in rows)[5] >= 12, "the machine was not held at load 12"


# Makes Ray's two agents start `NEMO_FP8_RL_TEST_LATE_AGENT_S` late, as a busy machine delays
# their imports (Python runs `sitecustomize` at start-up; the raylet passes PYTHONPATH on).
LATE_AGENTS = """import os, sys, time
if any(a.endswith(("dashboard/agent.py", "runtime_env/agent/main.py")) for a in sys.argv):
    time.sleep(float(os.environ["NEMO_FP8_RL_TEST_LATE_AGENT_S"]))
"""
START = """import os, sys
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
import ray
if sys.argv[1] == "ray.init":
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
else:
    from nemo_fp8_rl.runs.ray_start import start_ray
    start_ray(attempts=1)
print("answer", ray.get(ray.remote(lambda: 42).remote()), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("start", ["ray.init", "start_ray"])
def test_agents_later_than_the_raylets_15_s(tmp_path, start) -> None:
    """Ray's agents come up 25 s late: Ray as it ships fails (its raylet aborts when they have
    not reported their ports within a fixed 15 s); the engine's start does not wait for them
    and a worker answers. Deterministic: the lateness is a sleep, not load."""
    (tmp_path / "sitecustomize.py").write_text(LATE_AGENTS)
    (tmp_path / "start.py").write_text(START)
    env = {**os.environ, "NEMO_FP8_RL_TEST_LATE_AGENT_S": "25"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "start.py"), start],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    if start == "ray.init":
        assert proc.returncode != 0 and "timed out during startup" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0 and "answer 42" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_failed_ray_start_is_cleaned_up_and_retried(monkeypatch) -> None:
    """The first attempt fails for real (Ray's GCS port wait set to 0 s); the retry, with the
    wait restored, starts Ray; the failed attempt's processes are gone."""
    import psutil
    import ray

    from nemo_fp8_rl.runs.ray_start import StartRecord, start_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "0")
    # workers in this interpreter's environment, as the engine has them (Ray read the switch
    # when it was first imported, maybe by an earlier test)
    monkeypatch.setattr(ray._private.ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        if "retrying" in line:
            leftovers = [
                p for p in psutil.Process().children(recursive=True) if "gcs_server" in p.name()
            ]
            lines.append(f"leftover gcs: {len(leftovers)}")
            os.environ["RAY_gcs_server_port_wait_time_s"] = "120"  # noqa: SIM112 (Ray's name)

    record = StartRecord()
    try:
        assert start_ray(echo=echo, record=record) is True
        started = _what_ray_started()
    finally:
        ray.shutdown()
    assert len(record.attempts) >= 2 and record.errors, (lines, record)
    assert lines[0].startswith("starting Ray (attempt 1 of 5")
    assert "leftover gcs: 0" in lines
    # the lean node: no API server, no autoscaler monitor; the agents' ports known up front;
    # workers at the driver's priority
    assert not {"dashboard.py", "monitor.py"} & set(started["scripts"]), started
    assert {"gcs_server", "raylet"} <= set(started["scripts"]), started
    assert started["ports"] == {
        "dashboard_agent_listen_port": "-1",
        "metrics_agent_port": "-1",
        "metrics_export_port": "-1",
    }
    assert started["worker_nice"] == os.nice(0)


def _what_ray_started() -> dict:
    """The running Ray's processes (script or binary names), the dashboard agent's ports as
    written in the session folder, and a worker's niceness."""
    import psutil
    import ray

    names = []
    for proc in psutil.Process().children(recursive=True):
        cmd = proc.cmdline()
        script = next((Path(a).name for a in cmd[1:] if a.endswith(".py")), None)
        names.append(script or proc.name())
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    ports = {
        p.name.rsplit("_", 1)[0]: p.read_text().strip()
        for p in session.glob("*_port_*")
        if not p.name.startswith(("gcs_", "runtime_env_"))
    }
    nice = ray.get(ray.remote(lambda: os.nice(0)).remote())
    return {"scripts": names, "ports": ports, "worker_nice": nice}


@pytest.mark.slow
def test_ctrl_c_while_ray_starts_ends_with_the_error_line_only(tmp_path) -> None:
    import psutil

    script = Path(sys.executable).parent / "nemo_fp8_rl.train"
    cmd = [str(script), "--recipe", T, "--run-dir", str(tmp_path / "run"), *TWO_STEPS]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            names = [c.name() for c in parent.children(recursive=True)]
        except psutil.Error:
            names = []
        if "gcs_server" in names:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in out + err, err
    assert err.rstrip().splitlines()[-1].startswith("error: nemo_fp8_rl.train: interrupted"), err


@pytest.mark.slow
def test_never_started_run_then_finished_run(tmp_path) -> None:
    """Ray fails to start (one attempt, no GCS wait): the same command then trains the run; a
    third plain run is refused (checkpoints); --resume says the run is finished, without Ray."""
    run_dir = tmp_path / "run"
    failed = _train(
        run_dir, env={"NEMO_FP8_RL_RAY_START_ATTEMPTS": "1", "RAY_gcs_server_port_wait_time_s": "0"}
    )
    assert failed.returncode == 1 and "could not start Ray in 1 attempt(s)" in failed.stderr
    assert "starting Ray (attempt 1 of 1" in failed.stderr
    assert (run_dir / "recipe.yaml").exists()
    again = _train(run_dir)
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    third = _train(run_dir)
    assert third.returncode == 2 and "--resume to continue it" in third.stderr
    done = _train(run_dir, "--resume")
    assert done.returncode == 0 and "nothing to train" in done.stdout
    assert "starting Ray" not in done.stderr


@pytest.mark.slow
def test_seeds_rerun_finishes_the_missing_seed(tmp_path) -> None:
    """Seed 1 trained; seed 2 left before its first step: `--seeds 1-2` keeps 1, trains 2."""
    group = tmp_path / "group"
    script = Path(sys.executable).parent / "nemo_fp8_rl.train"
    base = [str(script), "--recipe", T, "--run-dir", str(group), *TWO_STEPS]
    first = subprocess.run([*base, "--seeds", "1"], capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stdout[-2000:]
    never_started(Workspace(group, lambda: group), "seed-2", ("grpo.seed=2", *TWO_STEPS))
    again = subprocess.run([*base, "--seeds", "1-2"], capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-2000:]
    assert "seed 1: ok (finished before, kept)" in again.stdout
    entries = {e["seed"]: e for e in read_summary(group)}
    assert entries[1]["kept"] and entries[2]["returncode"] == 0 and not entries[2]["kept"]


@pytest.mark.slow
def test_wandb_and_mlflow_on_a_real_run(tmp_path, monkeypatch) -> None:
    env = {"HOME": str(tmp_path / "home"), "WANDB_SILENT": "true"}
    for name in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    done = _train(
        tmp_path / "run", "logger.wandb_enabled=true", "logger.mlflow_enabled=true", env=env
    )
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "run/logs/wandb/wandb").glob("offline-run-*/*.wandb"))
    assert list((tmp_path / "run/logs/mlflow").glob("*/*/metrics/train/reward"))
