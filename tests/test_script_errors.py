"""The committed scripts (`scripts/dose_study.py`, `readme_evidence.py`, `fp8_mechanism.py`) as
commands: each refusal is one line `error: <where>: <what>. Fix: <how>` with the package's exit
code (2 for bad usage or input), never a traceback; Ctrl-C and SIGTERM end them with 130 and
one line, leaving no temporary folder and no half-written result; a generated block is written
only when all of it was computed (a page missing one pair of markers is left as it was).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_fp8_rl.cli.common import invoke

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Done:
    returncode: int
    stderr: str


def script(name: str, *argv: str) -> Done:
    """Run a script's `main` in this process through the package's `invoke`, as its
    `__main__` block does (one import of torch for every case, not one per case)."""
    spec = importlib.util.spec_from_file_location(f"script_{name[:-3]}", ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = invoke(module.main, list(argv), module.PROG)
    return Done(code, err.getvalue())


def one_error_line(done: Done | subprocess.CompletedProcess, code: int, says: str) -> None:
    err = done.stderr
    assert done.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and says in lines[0] and "Fix:" in lines[0], err
    assert "Traceback" not in err


# (script, arguments, what the error line names): each a refusal a user meets
CASES = [
    ("dose_study.py", ["nonsense"], "invalid choice"),
    ("dose_study.py", ["run", "--formats", "fp6"], "fp6"),
    ("dose_study.py", ["run", "--seeds", "3-1"], "--seeds"),
    ("dose_study.py", ["run", "--jobs", "0"], "--jobs"),
    ("dose_study.py", ["threshold", "--out", "/nonexistent-runs"], "threshold needs >= 2"),
    ("readme_evidence.py", ["--bogus"], "unrecognized arguments"),
    ("readme_evidence.py", ["--write", "/nonexistent/README.md"], "no such"),
    ("fp8_mechanism.py", ["--only", "no-such-variant"], "invalid choice"),
    ("fp8_mechanism.py", ["--steps", "0"], "--steps"),
    ("fp8_mechanism.py", ["--table", "/nonexistent.jsonl"], "no such"),
]


@pytest.mark.parametrize(("name", "argv", "says"), CASES)
def test_a_scripts_refusal_is_one_located_line(name, argv, says):
    one_error_line(script(name, *argv), 2, says)


def test_a_garbled_results_file_names_its_line(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"variant": "x"}\n')
    one_error_line(script("fp8_mechanism.py", "--table", str(bad)), 2, f"{bad}:1")


def test_a_results_file_that_is_a_pipe_or_a_folder_is_named_so(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    one_error_line(script("fp8_mechanism.py", "--table", str(pipe)), 2, "named pipe")
    one_error_line(script("fp8_mechanism.py", "--table", str(tmp_path)), 2, "a folder")


def test_a_write_target_that_is_a_pipe_is_refused_without_blocking(tmp_path):
    pipe = tmp_path / "README.md"
    os.mkfifo(pipe)
    one_error_line(script("readme_evidence.py", "--write", str(pipe)), 2, "named pipe")


def test_a_page_missing_one_pair_of_markers_is_left_as_it_was(tmp_path):
    from nemo_fp8_rl.study import dose_report
    from nemo_fp8_rl.study.doc_blocks import MarkersMissing

    page = tmp_path / "dose.md"
    text = f"{dose_report.TABLES[0]}\nold\n{dose_report.TABLES[1]}\n(no verdict markers)\n"
    page.write_text(text)
    with pytest.raises(MarkersMissing, match="dose-verdict"):
        dose_report.write_docs("new tables", "new verdict", page)
    assert page.read_text() == text


@pytest.mark.slow
def test_each_scripts_entry_point_reports_through_invoke():
    """The `__main__` block of each script prints the error line (one subprocess each)."""
    for name, argv, says in (CASES[1], CASES[5], CASES[8]):
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / name), *argv],
            capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        )  # fmt: skip
        one_error_line(done, 2, says)


def ours(tmp: Path) -> list[Path]:
    """The project's temporary entries in `tmp` (torch keeps its own compile cache there)."""
    return list(tmp.glob("nemo-fp8-rl-*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_mechanism_run_leaves_nothing_behind(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "fp8_mechanism.py"), "--only",
         "blockwise (default)", "--steps", "50", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().startswith("running"), proc.stderr.read()
        deadline = time.monotonic() + 120
        while not ours(tmp) and time.monotonic() < deadline:
            time.sleep(0.1)  # the variant's temporary folder exists: it is under way
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.count("error: ") == 1 and "interrupted" in err and "Traceback" not in err
    assert ours(tmp) == [] and out.read_text() == ""
