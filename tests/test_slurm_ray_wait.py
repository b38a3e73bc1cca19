"""`nemo_fp8_rl.slurm.ray_wait` against a real one-node Ray cluster started with `ray start`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_fp8_rl.slurm import ray_wait


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ray_head(monkeypatch):
    """A Ray head (1 CPU, 2 GPUs declared) in its own temp dir; stopped by SIGTERM, not `ray stop`."""
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists() and shutil.which("ray") is None:
        pytest.skip("the ray command line is not installed")
    tmp = Path(f"/tmp/rw-{os.getpid()}")
    port = _free_port()
    env = {
        **os.environ,
        "RAY_TMPDIR": str(tmp),
        "RAY_AUTH_MODE": "disabled",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp))
    cmd = [str(ray_bin) if ray_bin.exists() else "ray", "start", "--head", f"--port={port}",
           "--num-cpus=1", "--num-gpus=2", "--include-dashboard=false", "--disable-usage-stats",
           f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
           "--object-store-memory=100000000", "--block"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None and time.monotonic() < deadline, "ray head did not start"
        time.sleep(0.5)
    yield f"127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_waits_for_nodes_and_gpus_and_times_out(ray_head, capsys):
    assert ray_wait.main(["--address", ray_head, "--nodes", "1", "--gpus", "2"]) == 0
    assert "1 Ray node(s) alive" in capsys.readouterr().out
    assert ray_wait.main(["--address", ray_head, "--nodes", "2", "--timeout", "2"]) == 1
    assert "has 1 of 2 nodes and 2 of 0 GPUs" in capsys.readouterr().err
    with pytest.raises(TimeoutError, match="1 of 1 nodes and 2 of 4 GPUs"):
        ray_wait.wait_for_nodes(ray_head, 1, timeout_s=1, num_gpus=4)


def test_needs_an_address(monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SystemExit):
        ray_wait.main(["--nodes", "1"])
    assert "no Ray address" in capsys.readouterr().err
