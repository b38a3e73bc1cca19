"""Bounds on work and waiting: each input a hostile user can grow without limit, and each wait,
stops at a stated bound and says so.

- event files and metrics.jsonl: read up to `MAX_EVENT_BYTES` / `MAX_METRICS_BYTES`, and never
  past a tail of NUL bytes (what a crash leaves in a preallocated file), with a note each;
- a recipe with 100,000 misspelt keys: checked in seconds, its error lists the first
  `RecipeError.limit` problems and counts the rest;
- `cancel --wait`, `NEMO_FP8_RL_SLURM_TIMEOUT_S`: at most a day / an hour;
- `eval --samples`: at most `MAX_SAMPLES` (`--num-problems` at most the suite's problems);
- a Slurm client command that does not answer is killed with every process it started;
- an evaluation result file that is a named pipe is refused, not read for ever.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from nemo_fp8_rl.analysis import rundata
from nemo_fp8_rl.cli.common import invoke

GIB = 2**30


def _event_file(folder: Path) -> Path:
    from tensorboard.summary import Writer

    writer = Writer(str(folder))
    for step in (1, 2, 3):
        writer.add_scalar("train/loss", 0.5 * step, step=step)
    writer.close()
    return next(folder.glob("events.out.tfevents.*"))


def test_an_event_file_with_a_2_gb_nul_tail_is_read_in_seconds(tmp_path):
    path = _event_file(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size + 2 * GIB)  # sparse: 2 GB of NULs, as a crash leaves them
    t0 = time.perf_counter()
    rows, notes = rundata.read_event_file(path)
    took = time.perf_counter() - t0
    assert sorted(rows) == [1, 2, 3] and rows[3]["train/loss"] == 1.5
    assert any("NUL bytes from byte" in n for n in notes), notes
    assert any(f"read only the first {rundata.MAX_EVENT_BYTES:,}" in n for n in notes), notes
    assert took < 30, took


def test_a_metrics_file_with_a_nul_tail_keeps_its_lines_and_says_so(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 0.5}\n{"step": 2, "train/loss": 0.25}\n')
    os.truncate(path, path.stat().st_size + 64 * 2**20)
    rows, notes = rundata.read_jsonl(path)
    assert rows == {1: {"train/loss": 0.5}, 2: {"train/loss": 0.25}}
    assert len(notes) == 1 and "NUL bytes" in notes[0]


def test_a_metrics_path_that_is_a_pipe_is_refused_not_read(tmp_path):
    from nemo_fp8_rl.config.safe_files import UnsafePath

    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(UnsafePath, match="named pipe"):
        rundata.read_jsonl(tmp_path / "metrics.jsonl")


def test_a_recipe_with_100000_misspelt_keys_is_one_screen_in_seconds(tmp_path):
    from nemo_fp8_rl.config import RecipeError, load_recipe

    base = Path(__file__).resolve().parents[1] / "configs" / "base" / "grpo.yaml"
    lines = [f"defaults: {base}", "policy:"] + [f"  lerning_rate_{i}: 1" for i in range(100_000)]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    took = time.perf_counter() - t0
    text = str(err.value)
    assert len(err.value.issues) > 100_000 - 1
    assert text.count("\n  - ") == RecipeError.limit and "... and " in text
    assert len(text) < 100_000 and took < 120, (len(text), took)


@pytest.mark.parametrize("wait", ["1e308", "inf", "nan", "0", "-5", "86401"])
def test_cancel_wait_is_finite_and_at_most_a_day(wait, capsys):
    from nemo_fp8_rl.cli import submit

    assert invoke(submit.main, ["cancel", "4242", "--wait", wait]) == 2
    err = capsys.readouterr().err
    assert "--wait" in err and "at most 86400" in err and "Fix:" in err


def test_the_slurm_timeout_setting_is_bounded(monkeypatch):
    from nemo_fp8_rl.slurm import SlurmError
    from nemo_fp8_rl.slurm.jobs import command_timeout

    monkeypatch.setenv("NEMO_FP8_RL_SLURM_TIMEOUT_S", "1e308")
    with pytest.raises(SlurmError, match="at most 3600"):
        command_timeout()


@pytest.mark.parametrize(("flag", "value"), [("--samples", "1025"), ("--samples", "99999999999")])
def test_eval_work_per_command_line_is_bounded(flag, value, tmp_path, capsys):
    from nemo_fp8_rl.cli import eval as eval_cli

    code = invoke(eval_cli.main, ["--run", str(tmp_path), flag, value, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and "at most" in err, err


def test_a_slurm_command_that_hangs_is_killed_with_its_children(tmp_path, monkeypatch):
    """A stand-in `squeue` (a shell script on PATH) that starts a child and never answers."""
    from nemo_fp8_rl.slurm import SlurmError
    from nemo_fp8_rl.slurm.jobs import job_status

    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "bin" / "squeue"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for name in ("sacct", "scontrol"):
        (fake.parent / name).symlink_to(fake)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("NEMO_FP8_RL_SLURM_TIMEOUT_S", "1")
    with pytest.raises(SlurmError, match="no answer in 1 s"):
        job_status("4242")
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, reaped by init later, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_an_eval_result_that_is_a_pipe_is_refused_without_blocking(tmp_path):
    from nemo_fp8_rl.evals.results import EvalReadError, read_result

    os.mkfifo(tmp_path / "cpu.last.json")
    with pytest.raises(EvalReadError, match="named pipe"):
        read_result(tmp_path / "cpu.last.json")


@pytest.mark.parametrize("score", ["NaN", "1.5", "-0.1", "Infinity", "true"])
def test_an_eval_score_outside_0_1_is_refused_not_compared(score, tmp_path):
    from nemo_fp8_rl.evals.results import EvalReadError, read_result

    path = tmp_path / "addition.last.json"
    path.write_text(
        '{"suite": "addition", "run": "r", "checkpoint": {"selector": "last", "step": 2}, '
        f'"benchmarks": {{"add2": {{"score": {score}}}}}}}'
    )
    with pytest.raises(EvalReadError, match=r"benchmarks\.add2\.score .* not a share in \[0, 1\]"):
        read_result(path)
