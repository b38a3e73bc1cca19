"""Jobs on a real Slurm cluster (`scripts/local-slurm.sh up`: fake nodes n1, n2 on this host).

The tiny FP8 recipe runs as a 2-node job (Ray head on n1, Ray worker on n2) to COMPLETED and
leaves metrics, a checkpoint and the saved script in its run directory; a one-node
`submit --eval` job then evaluates its last checkpoint. A second job, submitted
with hostile values in job name, env and overrides, is cancelled once training has started; no
process of it may survive and no injected command may have run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.slurm import job_status, wait_for_state

pytestmark = pytest.mark.slurm

RECIPE = "tiny/grpo-tiny-qwen3-cpu-fp8"
FAST = [
    "grpo.max_num_steps=2",
    "grpo.val_at_start=false",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "local.warmup.steps=10",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=32",
]


@pytest.fixture(scope="module")
def cluster() -> int:
    """Number of usable nodes; skips with the reason when no Slurm cluster answers."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        pytest.skip("Slurm client commands not installed (start one: scripts/local-slurm.sh up)")
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle,mixed,allocated", "-o", "%N"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.skip(f"no Slurm cluster reachable: sinfo: {proc.stderr.strip()}")
    nodes = set(proc.stdout.split())
    if len(nodes) < 2:
        pytest.skip(f"need 2 responding Slurm nodes, found {sorted(nodes)} (LOCAL_SLURM_NODES=2)")
    return len(nodes)


def _submit(capsys, run_dir: Path, *extra: str) -> tuple[str, float]:
    start = time.time()
    args = ["--recipe", RECIPE, "--run-dir", str(run_dir), "--nodes", "2", "--time", "00:15:00"]
    assert submit_cli.main([*args, *extra]) == 0
    out = capsys.readouterr().out
    job_id = re.search(r"Submitted job (\d+)", out).group(1)
    assert f"Run directory: {run_dir}" in out
    return job_id, start


def _report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[slurm timing] {line}")


def _wait_for_file(path: Path, job_id: str, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        status = job_status(job_id)
        assert not status.finished, f"job {job_id} ended ({status.state}) before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.5)
    return float(path.read_text().strip())


def _job_processes(job_id: str, markers: list[str]) -> list[str]:
    """Live processes that belong to the job: its SLURM_JOB_ID in their environment, or a
    job-specific path (run dir, Ray temp dir) on their command line. Zombies do not count."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state in "ZX":
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env or any(m in cmd for m in markers):
            found.append(f"{proc.name}: {cmd[:200]}")
    return found


def test_two_node_job_trains_to_completion(cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    job_id, submitted = _submit(capsys, run_dir, *FAST)
    started = _wait_for_file(run_dir / "slurm" / job_id / "train.started", job_id, 300)
    _report(capsys, f"submit -> training start: {started - submitted:.1f} s")
    status = wait_for_state(job_id, timeout_s=600)
    log = (run_dir / "slurm" / f"slurm-{job_id}.out").read_text()
    assert status.state == "COMPLETED", f"job {job_id}: {status}\n{log[-3000:]}"
    _report(capsys, f"submit -> COMPLETED: {time.time() - submitted:.1f} s")
    assert "ray_wait: 2 Ray node(s) alive" in log
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/loss" in m][-1] == 2
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / Path(latest).name).is_dir()
    script = run_dir / "slurm" / "grpo-tiny-qwen3-cpu-fp8.sbatch"
    assert script.read_text().startswith("#!/bin/bash")
    assert (run_dir / "slurm" / "grpo-tiny-qwen3-cpu-fp8.yaml").is_file()
    assert (run_dir / "slurm" / job_id / "ray-worker-0.log").is_file()

    assert submit_cli.main(["status", job_id]) == 0
    assert f"job {job_id}: COMPLETED (exit 0:0)" in capsys.readouterr().out
    assert submit_cli.main(["logs", job_id]) == 0
    assert "training exited with code 0" in capsys.readouterr().out
    assert _job_processes(job_id, [str(run_dir), f"/tmp/ray-{job_id}-"]) == []

    # the trained run evaluated by a one-node `submit --eval` job (nemo_fp8_rl.eval in the job)
    assert (
        submit_cli.main(["--eval", str(run_dir), "--checkpoint", "last", "--time", "00:10:00"]) == 0
    )
    eval_id = re.search(r"Submitted job (\d+)", capsys.readouterr().out).group(1)
    status = wait_for_state(eval_id, timeout_s=600)
    log = (run_dir / "slurm" / f"slurm-{eval_id}.out").read_text()
    assert status.state == "COMPLETED", f"job {eval_id}: {status}\n{log[-3000:]}"
    assert "evaluation starts" in log and "ray_wait: 1 Ray node(s) alive" in log
    result = json.loads((run_dir / "eval" / "addition.last.json").read_text())
    assert result["checkpoint"]["step"] == 2 and set(result["benchmarks"]) == {
        "add2-heldout",
        "add3",
    }
    _report(capsys, f"evaluation job: {time.time() - submitted:.1f} s after the first submit")


def test_cancel_leaves_nothing_behind_and_injection_stays_data(cluster, tmp_path, capsys):
    canary = tmp_path / "canary"
    evil = f"n$(touch {canary})`touch {canary}`;touch {canary}'x"
    run_dir = tmp_path / "run two"
    env_value = json.dumps(f"$(touch {canary})\"'; touch {canary}")
    job_id, _ = _submit(
        capsys,
        run_dir,
        "--job-name",
        evil,
        f"slurm.env.EVIL={env_value}",
        *FAST,
        "grpo.max_num_steps=50",
    )
    _wait_for_file(run_dir / "slurm" / job_id / "train.started", job_id, 300)
    name = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%j"], capture_output=True, text=True
    )
    assert name.stdout.strip() == evil
    markers = [str(run_dir), f"/tmp/ray-{job_id}-"]
    running = _job_processes(job_id, markers)
    assert any("nemo_fp8_rl.train" in p for p in running), running  # the detector sees the job
    assert any("raylet" in p for p in running), running
    assert submit_cli.main(["status", job_id]) == 0
    assert f"job {job_id}: RUNNING" in capsys.readouterr().out
    assert submit_cli.main(["cancel", job_id]) == 0
    assert f"job {job_id}: CANCELLED" in capsys.readouterr().out
    deadline = time.monotonic() + 30  # the kernel may take a moment to reap what Slurm killed
    while (left := _job_processes(job_id, markers)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []
    assert not canary.exists()
    assert submit_cli.main(["logs", job_id, "--ray"]) == 0
    logs = capsys.readouterr().out
    assert "starting the Ray head" in logs and "joining the Ray cluster" in logs


def test_local_cluster_status_and_unknown_job(cluster, capsys):
    script = Path(__file__).parents[1] / "scripts" / "local-slurm.sh"
    state_dir = Path(os.environ.get("LOCAL_SLURM_DIR", "/var/tmp/slurm-local"))
    if not (state_dir / "etc" / "slurm.conf").exists():
        pytest.skip("this Slurm cluster was not started by scripts/local-slurm.sh")
    proc = subprocess.run(
        ["bash", str(script), "status"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "slurmctld up" in proc.stdout and re.search(r"^n2 ", proc.stdout, re.M)
    assert invoke(submit_cli.main, ["status", "999999"]) == 1
    assert "job 999999: Slurm has no record of it" in capsys.readouterr().err
