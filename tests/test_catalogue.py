"""Every bad input and fault in `catalogue_cases.CASES` ends as its expected outcome: the exit
code, a located message, no traceback, and (for failures) nothing changed on disk.

Commands run in-process through `nemo_fp8_rl.cli.common.invoke` (what the console scripts
run); cases marked `subprocess` also run as the real console script, to prove that no
traceback reaches the terminal. The slow test kills a real run with SIGKILL and resumes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from catalogue_cases import CASES, Case, Workspace, write_tiny_hf

from nemo_fp8_rl.cli import compare, recipes, refit, submit, train
from nemo_fp8_rl.cli.common import invoke

MAINS = {
    "recipes": recipes.main,
    "train": train.main,
    "submit": submit.main,
    "compare": compare.main,
    "refit": refit.main,
}


@pytest.fixture(scope="session")
def hf_source(tmp_path_factory):
    """A tiny BF16 Qwen3 checkpoint, built once (lazily: only refit cases need it)."""
    built: list[Path] = []

    def get() -> Path:
        if not built:
            built.append(write_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny"))
        return built[0]

    return get


def tree_state(root: Path) -> dict[str, str]:
    """Every path under `root` with the SHA-256 of its bytes ('dir' for folders)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _fill(text: str, ws: Path) -> str:
    return text.replace("{ws}", str(ws))


def prepare_case(case: Case, tmp_path: Path, hf_source, monkeypatch) -> tuple[Path, list[str]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    if case.setup is not None:
        case.setup(Workspace(ws, hf_source))
    monkeypatch.chdir(ws)
    for name, value in case.env.items():
        monkeypatch.setenv(name, _fill(value, ws))
    return ws, [_fill(a, ws) for a in case.argv]


# `error: <where>: <what>. Fix: <how>`, or a recipe's problems as `  - <file>: <key>: ... Fix:`.
ERROR_LINE = re.compile(r"^(error: |  - )\S[^\n]*?: [^\n]*?\S\. Fix: \S", re.M)


def check_case_output(case: Case, code: int, out: str, err: str, ws: Path) -> None:
    assert "Traceback" not in out + err, err
    assert "internal error" not in err, err
    assert code == case.code, (
        f"exit {code}, expected {case.code}\nstdout: {out[-2000:]}\nstderr: {err}"
    )
    assert _fill(case.fragment, ws) in out + err, f"stdout: {out[-2000:]}\nstderr: {err}"
    assert _fill(case.stdout, ws) in out, out[-2000:]
    if code != 0:  # `validate` too: its report is on stdout, its error line on stderr
        assert err.startswith("error: ") or "\nerror: " in err, err
        assert ERROR_LINE.search(err), f"not `error: <where>: <what>. Fix: <how>`:\n{err}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_catalogue(case: Case, tmp_path, hf_source, monkeypatch, capsys) -> None:
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    before = tree_state(ws)
    code = invoke(MAINS[case.command], argv, prog=f"nemo_fp8_rl.{case.command}")
    captured = capsys.readouterr()
    check_case_output(case, code, captured.out, captured.err, ws)
    if not case.changes:
        assert tree_state(ws) == before, "the command changed files although it failed"
    assert not Path("/recipe.yaml").exists()


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_console_script_prints_no_traceback(case: Case, tmp_path, hf_source, monkeypatch) -> None:
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    before = tree_state(ws)
    script = Path(sys.executable).parent / f"nemo_fp8_rl.{case.command}"
    proc = subprocess.run(
        [str(script), *argv], capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    check_case_output(case, proc.returncode, proc.stdout, proc.stderr, ws)
    assert tree_state(ws) == before


def test_debug_flag_shows_the_traceback(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "r.yaml").write_text("defaults: 5\n")
    assert invoke(recipes.main, ["show", str(tmp_path / "r.yaml"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "error: recipe" in err


def test_internal_error_says_so_and_where_to_report(capsys) -> None:
    def broken(argv):
        raise KeyError("oops")

    assert invoke(broken, [], prog="nemo_fp8_rl.train") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: nemo_fp8_rl.train: internal error (KeyError: 'oops')")
    assert "issue tracker" in err and "--debug" in err and "Traceback" not in err


def test_catalogue_size() -> None:
    """At least 80 cases, each command covered; the breakdown is printed with -s."""
    by_command = Counter(c.command for c in CASES)
    by_outcome = Counter(
        "accepted" if c.code == 0 else ("usage (2)" if c.code == 2 else f"runtime ({c.code})")
        for c in CASES
    )
    print(
        f"catalogue: {len(CASES)} cases; by command {dict(by_command)}; by outcome {dict(by_outcome)}"
    )
    assert len(CASES) >= 80
    assert set(by_command) == set(MAINS)
    assert len({c.id for c in CASES}) == len(CASES)


# ---- a real run killed with SIGKILL, then resumed --------------------------------------------

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


def _train(run_dir: Path, *extra: str) -> subprocess.Popen:
    script = Path(sys.executable).parent / "nemo_fp8_rl.train"
    args = [str(script), "--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16", "--run-dir", str(run_dir)]
    return subprocess.Popen(
        [*args, "--no-progress", *FAST, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train_values(run_dir: Path) -> dict[int, dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        r["step"]: {
            k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/", "system/"))
        }
        for r in records
    }


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NEMO_FP8_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    full = _train(tmp_path / "full")
    assert full.wait(timeout=900) == 0, full.stderr.read()
    killed = _train(tmp_path / "part")
    latest = tmp_path / "part/checkpoints/latest"
    deadline = time.time() + 900
    while not (latest.exists() and latest.read_text().strip() == "step_1"):
        assert killed.poll() is None and time.time() < deadline, killed.stderr.read()
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    again = _train(tmp_path / "part")  # neither --resume nor --overwrite: refused, nothing lost
    assert again.wait(timeout=600) == 2 and "--resume to continue it" in again.stderr.read()
    resumed = _train(tmp_path / "part", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()
    assert _train_values(tmp_path / "part") == _train_values(tmp_path / "full")
