"""Seeds as an axis: `--seeds` parsing, the launcher (real child processes), and the seeds
command end to end with the real tiny engine, one seed killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_fast import TWO_STEPS

from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.runs.seeds import (
    SeedSpecError,
    parse_seeds,
    run_seeds,
    seed_dirs,
    seed_of_dir,
    seed_run_dir,
    summary_lines,
)

FAST = [
    *TWO_STEPS,
    "grpo.num_prompts_per_step=8",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
]


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("1,2,3", [1, 2, 3]), ("1-5", [1, 2, 3, 4, 5]), ("3-4, 1,7", [1, 3, 4, 7]), ("0", [0])],
)
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "1,,2", "5-3", "a", "1-", "-2", "1.5"])
def test_parse_seeds_refuses(text):
    with pytest.raises(SeedSpecError, match="e.g. 1"):
        parse_seeds(text)


def test_seed_dir_names(tmp_path):
    assert seed_run_dir(tmp_path / "r", 3) == tmp_path / "r" / "seed-3"
    assert seed_of_dir(Path("runs/x/seed-12")) == 12
    assert seed_of_dir(Path("runs/x/seed-a")) is None
    assert seed_of_dir(Path("runs/x/model")) is None


def test_launcher_runs_every_seed_and_records_failures(tmp_path):
    """Real child processes: one exits 0, one exits 3, one kills itself; parallel 2."""
    py = sys.executable
    commands = {
        1: [py, "-c", "print('hello from one')"],
        2: [py, "-c", "import sys; print('bad'); sys.exit(3)"],
        3: [py, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        4: [py, "-c", "print('four')"],
    }
    lines: list[str] = []
    outcomes = run_seeds(commands, tmp_path, parallel=2, echo=lines.append, poll_s=0.05)
    assert [(o.seed, o.returncode) for o in outcomes] == [(1, 0), (2, 3), (3, -9), (4, 0)]
    assert "[seed 1] hello from one" in lines and "[seed 4] four" in lines
    assert (tmp_path / "seed-2" / "train.log").read_text() == "bad\n"
    summary = summary_lines(outcomes)
    shown = [*lines, *summary]  # what the terminal shows: each seed's end once, then the count
    for seed, start in ((2, "seed 2: FAILED (exit 3)"), (3, "seed 3: FAILED (killed by signal 9)"),
                        (1, "seed 1: ok")):  # fmt: skip
        assert len([x for x in shown if x.startswith(start)]) == 1, (seed, shown)
    assert summary == ["2 of 4 seeds finished; failed: 2, 3"]
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert [s["returncode"] for s in saved["seeds"]] == [0, 3, -9, 0]


def test_seeds_refuses_seed_override_and_bad_list(capsys):
    recipe = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16"]
    assert invoke(train_cli.main, [*recipe, "--seeds", "1,2", "grpo.seed=4"]) == 2
    assert "drop the grpo.seed override" in capsys.readouterr().err
    assert invoke(train_cli.main, [*recipe, "--seeds", "2-1"]) == 2
    assert "not a range" in capsys.readouterr().err


def test_seeds_checks_every_run_dir_before_starting(tmp_path, capsys):
    """Seed 2's folder holds a run with other settings: nothing starts, the error names it."""
    group = tmp_path / "g"
    (group / "seed-2").mkdir(parents=True)
    (group / "seed-2" / "recipe.yaml").write_text(yaml.safe_dump({"grpo": {"seed": 99}}))
    args = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16", "--run-dir", str(group), "--seeds", "1,2"]
    assert invoke(train_cli.main, args) == 2
    assert f"{group / 'seed-2'}: already holds a run" in capsys.readouterr().err
    assert not (group / "seed-1").exists()


def _child_of(parent: int, marker: str) -> int | None:
    """The pid of a live descendant of `parent` whose command line contains `marker`."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == parent and marker in cmd and "nemo_fp8_rl.train" in cmd:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_seeds_command_real_engine_one_seed_killed(tmp_path):
    """Two seeds of the tiny BF16 recipe, one after another; seed 1 is SIGKILLed once its run
    directory exists; seed 2 still trains to the end; the exit code is 1 and the summary says so."""
    group = tmp_path / "bf16"
    env = {**os.environ, "NEMO_FP8_RL_CACHE": str(tmp_path / "cache"), "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    cmd = [sys.executable, "-m", "nemo_fp8_rl.train", "--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16"]
    cmd += ["--run-dir", str(group), "--seeds", "1,2", *FAST]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    deadline = time.monotonic() + 120
    victim = None
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        if (group / "seed-1" / "recipe.yaml").exists():
            victim = _child_of(proc.pid, str(group / "seed-1"))
        time.sleep(0.2)
    assert victim is not None, "seed 1 never started"
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out
    assert "seed 1: FAILED (killed by signal 9)" in out
    assert "seed 2: ok" in out and "1 of 2 seeds finished; failed: 1" in out
    run2 = group / "seed-2"
    metrics = [json.loads(x) for x in (run2 / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/loss" in m][-1] == 2
    saved = yaml.safe_load((run2 / "recipe.yaml").read_text())
    assert (
        saved["grpo"]["seed"] == 2
        and saved["logger"]["wandb"]["name"] == "grpo-tiny-qwen3-cpu-bf16"
    )
    assert "run finished" in (run2 / "train.log").read_text()
    assert seed_dirs(group) == [run2]


def test_sigterm_to_the_launcher_stops_its_children(tmp_path):
    """`kill` (or scancel / timeout) on the launcher: the running seed is stopped, nothing is left
    behind, the rest are not started, and seeds.json says so."""
    script = (
        "import sys; from pathlib import Path; from nemo_fp8_rl.runs.seeds import run_seeds\n"
        "py = sys.executable\n"
        "cmds = {1: [py, '-c', 'import time; print(\"up\", flush=True); time.sleep(120)'],\n"
        "        2: [py, '-c', 'print(2)']}\n"
        f"run_seeds(cmds, Path({str(tmp_path)!r}), poll_s=0.05)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    child = None
    while child is None and time.monotonic() < deadline:
        log = tmp_path / "seed-1" / "train.log"
        if log.exists() and "up" in log.read_text():
            child = next(
                int(p.name)
                for p in Path("/proc").glob("[0-9]*")
                if (p / "stat").exists()
                and int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid
            )
        time.sleep(0.05)
    assert child is not None
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=600)
    assert proc.returncode != 0
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()
    saved = json.loads((tmp_path / "seeds.json").read_text())["seeds"]
    assert [(s["seed"], s["returncode"]) for s in saved] == [(1, -15), (2, None)]
