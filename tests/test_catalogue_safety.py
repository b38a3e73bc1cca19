"""Bounded work, safe writes and verified reads: every case of `catalogue_safety_cases.CASES`
ends as expected (the harness of `test_catalogue.py`), within a bound on time, without a
traceback, and (for failures) with the scratch folder as it was, symbolic links included.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from catalogue_safety_cases import CASES
from test_catalogue import MAINS, check_case_output, hf_source, prepare_case

from nemo_fp8_rl.cli import eval as eval_cli
from nemo_fp8_rl.cli import study
from nemo_fp8_rl.cli.common import invoke

COMMANDS = {**MAINS, "eval": eval_cli.main, "study": study.main}
__all__ = ["hf_source"]  # the session fixture, shared with test_catalogue.py


BOUND_S = 600  # a case still running after this long is a hang (each takes seconds when quiet)


class Hung(BaseException):
    """Raised by the alarm: not an Exception, so `invoke` cannot report it as an error line."""


@contextlib.contextmanager
def bounded(seconds: int = BOUND_S):
    """Fail the case with `Hung` when it runs longer than `seconds`."""

    def ring(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def tree_state(root: Path) -> dict[str, str]:
    """Every path under `root`: a link as its target (never followed), a folder as 'dir', a file
    as the SHA-256 of its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link -> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            elif not path.is_file():  # a FIFO: opening it would wait for a writer
                out[rel] = "special"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _prepare(case, tmp_path, hf_source, monkeypatch):
    from test_catalogue_cli import _nemo_rl_importable

    if case.code == 3 and _nemo_rl_importable():
        pytest.skip("NeMo RL is importable here: the engine is usable")
    return prepare_case(case, tmp_path, hf_source, monkeypatch)


def run_in_process(case, commands, ws: Path, argv: list[str], capsys) -> None:
    """Run a case's command in this process (hang-bounded) and check its exit code and output;
    a case that changes nothing must leave the workspace byte for byte as it was."""
    capsys.readouterr()  # what the setup printed
    before = tree_state(ws)
    with bounded():
        code = invoke(commands[case.command], argv, prog=f"nemo_fp8_rl.{case.command}")
    captured = capsys.readouterr()
    check_case_output(case, code, captured.out, captured.err, ws)
    if not case.changes:
        assert tree_state(ws) == before, "the command changed files although it failed"


def run_console_script(case, ws: Path, argv: list[str]) -> None:
    """Run a case through its installed console script (a real process: no traceback may
    reach the terminal) and check it as `run_in_process` does."""
    before = tree_state(ws)
    script = Path(sys.executable).parent / f"nemo_fp8_rl.{case.command}"
    proc = subprocess.run(
        [str(script), *argv], capture_output=True, text=True, timeout=BOUND_S, env=dict(os.environ)
    )
    check_case_output(case, proc.returncode, proc.stdout, proc.stderr, ws)
    if not case.changes:
        assert tree_state(ws) == before


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_catalogue_safety(case, tmp_path, hf_source, monkeypatch, capsys) -> None:
    ws, argv = _prepare(case, tmp_path, hf_source, monkeypatch)
    run_in_process(case, COMMANDS, ws, argv, capsys)


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_console_script_prints_no_traceback(case, tmp_path, hf_source, monkeypatch) -> None:
    ws, argv = _prepare(case, tmp_path, hf_source, monkeypatch)
    run_console_script(case, ws, argv)


def test_catalogue_size() -> None:
    """The breakdown is printed with -s."""
    by_command = Counter(c.command for c in CASES)
    print(f"safety catalogue: {len(CASES)} cases; by command {dict(by_command)}")
    assert len({c.id for c in CASES}) == len(CASES)


# ---- full disks: what was there stays, the failure is one located line ----------------------


def _limited(limit_bytes: int):
    """A `preexec_fn` capping the size of any file the child writes (writes past it fail with
    EFBIG; Python ignores the SIGXFSZ that comes with it)."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))

    return apply


def _export(src: Path, out: Path, **kw) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "nemo_fp8_rl.refit"
    return subprocess.run(
        [str(script), "export", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        **kw,
    )


def _earlier_export(tmp_path: Path, hf_source) -> tuple[Path, Path, dict[str, str]]:
    from catalogue_cases import Workspace

    ws = Workspace(tmp_path, hf_source)
    out = ws.export("out")
    src = ws.hf("src")
    return src, out, tree_state(out)


@pytest.mark.parametrize("earlier", [False, True], ids=["new-export", "replacing-an-export"])
def test_export_past_the_file_size_limit(earlier, tmp_path, hf_source) -> None:
    """EFBIG (RLIMIT_FSIZE): a new export leaves no folder, a replacing one the earlier
    export byte for byte; no temporary folder stays behind; one located line, exit 1."""
    from catalogue_cases import Workspace

    if earlier:
        src, out, before = _earlier_export(tmp_path, hf_source)
    else:
        src, out, before = Workspace(tmp_path, hf_source).hf("src"), tmp_path / "out", {}
    proc = _export(src, out, preexec_fn=_limited(64 * 1024))
    assert proc.returncode == 1, proc.stderr
    kept = "the earlier export is kept" if earlier else "nothing was written"
    assert f"error: {out}: File too large while writing; {kept}. Fix: free space" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert (tree_state(out) if earlier else out.exists()) == (before if earlier else False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def _can_mount_tmpfs() -> bool:
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not shutil.which("unshare") or not _can_mount_tmpfs(),
    reason="no user namespace here to mount a small tmpfs in",
)
def test_export_on_a_full_tmpfs_keeps_the_earlier_export(tmp_path, hf_source) -> None:
    """ENOSPC on a real (tmpfs) file system just big enough for the earlier export: replacing
    it fails, and the earlier export is there, byte for byte."""
    src, out, before = _earlier_export(tmp_path, hf_source)
    size = sum(p.stat().st_size for p in out.iterdir()) + 64 * 1024
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = Path(sys.executable).parent / "nemo_fp8_rl.refit"
    inner = (
        f"mount -t tmpfs -o size={size} tmpfs {mnt} && cp -r {out} {mnt}/out && "
        f"{script} export {src} {mnt}/out; echo rc=$?; cd {mnt}/out && sha256sum * && ls -a {mnt}"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, timeout=BOUND_S
    )
    assert "rc=1" in proc.stdout, proc.stdout + proc.stderr
    assert "No space left on device while writing; the earlier export is kept" in proc.stderr
    assert "Traceback" not in proc.stderr
    for name, digest in before.items():
        assert f"{digest}  {name}" in proc.stdout
    assert ".out.tmp-" not in proc.stdout


def test_write_atomic_past_the_file_size_limit_keeps_the_old_file(tmp_path) -> None:
    """The one writer every report, record and recipe copy goes through (EFBIG, in a child)."""
    target = tmp_path / "report.md"
    target.write_text("old\n")
    code = (
        "from pathlib import Path; from nemo_fp8_rl.config.safe_files import write_atomic\n"
        f"write_atomic(Path({str(target)!r}), 'x' * 100_000)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        preexec_fn=_limited(4096),
    )
    assert "DiskFull" in proc.stderr and "the previous file is kept" in proc.stderr
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
