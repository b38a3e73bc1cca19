"""Ray ending the training process while it registers with its raylet is located and retried
(`runs.ray_exit`), with real child processes that end as Ray's core worker ends them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from nemo_fp8_rl.cli.train import trains
from nemo_fp8_rl.runs import ray_exit
from nemo_fp8_rl.runs.ray_exit import MARK, supervise

RAY_LINE = (
    "[2026-12-03 15:32:42,144 E 8414 8414] core_worker_process.cc:247: Failed to register "
    "worker to Raylet: IOError: Failed to read data from the socket: End of file"
)


def child(tmp_path: Path, fails: int, mark: bool = True) -> list[str]:
    """A command that ends like Ray's failed registration for its first `fails` runs."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import pathlib, sys
        runs = pathlib.Path({str(tmp_path / "runs")!r})
        n = len(runs.read_text()) if runs.exists() else 0
        runs.write_text("x" * (n + 1))
        print("training output", flush=True)
        if n < {fails}:
            print({RAY_LINE if mark else "some other failure"!r}, file=sys.stderr, flush=True)
            sys.exit(1)
        print("child stderr line", file=sys.stderr, flush=True)
    """)
    )
    return [sys.executable, str(script)]


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text())


def test_a_registration_failure_is_located_and_the_command_run_again(tmp_path, capfd):
    said: list[str] = []
    assert supervise(child(tmp_path, fails=1), attempts=3, echo=said.append) == 0
    assert runs(tmp_path) == 2
    assert len(said) == 1 and said[0].startswith("error: ray.init in the training process")
    assert MARK in said[0] and "load" in said[0] and "attempt 2 of 3" in said[0]
    out, err = capfd.readouterr()
    assert "training output" in out and "child stderr line" in err and MARK in err


def test_it_gives_up_after_the_attempts_with_the_fix(tmp_path):
    said: list[str] = []
    assert supervise(child(tmp_path, fails=9), attempts=2, echo=said.append) == 1
    assert runs(tmp_path) == 2
    assert "Gave up after 2 attempts" in said[-1] and "Fix:" in said[-1]


def test_any_other_failure_is_returned_as_it_is(tmp_path):
    said: list[str] = []
    assert supervise(child(tmp_path, fails=1, mark=False), attempts=3, echo=said.append) == 1
    assert runs(tmp_path) == 1 and said == []


def test_only_a_single_training_run_is_supervised():
    recipe = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8"]
    assert trains(recipe)
    assert trains([*recipe, "--resume", "grpo.max_num_steps=3"])
    for other in (["--dry-run"], ["--preflight"], ["--seeds", "1-2"], ["--help"], ["--bogus"]):
        assert not trains([*recipe, *other]), other


def test_sigterm_to_the_supervisor_reaches_the_training_process(tmp_path):
    """`kill` on `nemo_fp8_rl.train` ends the training process as before (exit 130 here)."""
    started = tmp_path / "started"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        textwrap.dedent(f"""
        import pathlib, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))
        pathlib.Path({str(started)!r}).write_text("up")
        time.sleep(600)
    """)
    )
    wrapper = (
        "import sys; from nemo_fp8_rl.runs.ray_exit import supervise; "
        f"sys.exit(supervise([sys.executable, {str(trainer)!r}]))"
    )
    proc = subprocess.Popen([sys.executable, "-c", wrapper], env={**os.environ})
    deadline = time.monotonic() + 300
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 130


def test_the_child_does_not_supervise_again(monkeypatch):
    monkeypatch.setenv(ray_exit.CHILD, "1")
    assert ray_exit.is_child()


def test_the_console_script_supervises_a_training_run(monkeypatch):
    """`nemo_fp8_rl.train` hands a training run to `supervise` (recorded here), as the child
    command `python -m nemo_fp8_rl.cli.train` with the same arguments."""
    import pytest

    from nemo_fp8_rl.cli import train

    recorded: list[list[str]] = []
    monkeypatch.delenv(ray_exit.CHILD, raising=False)
    monkeypatch.setattr(ray_exit, "supervise", lambda command: recorded.append(command) or 7)
    argv = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "grpo.max_num_steps=1"]
    monkeypatch.setattr(sys, "argv", ["nemo_fp8_rl.train", *argv])
    with pytest.raises(SystemExit) as done:
        train.entry()
    assert done.value.code == 7
    assert recorded == [[sys.executable, "-m", "nemo_fp8_rl.cli.train", *argv]]
