"""Nothing left behind: every temporary file and folder a command creates is removed on
success, on an error, on Ctrl-C (SIGINT) and on SIGTERM, and one left by SIGKILL is removed by
the next command of the same kind (its name holds the pid of the process that made it).

Each case runs the real command through `invoke`, as its console script does, and delivers a
real signal to this process at the moment the temporary folder exists (from inside the step
that fills it); the command's interrupt handling, not the test, must clean up.

| command | temporary | case |
|---|---|---|
| `train --recipe NEMO.yaml --dry-run` | `<TMPDIR>/nemo-fp8-rl-import-<pid>-*` | error, SIGINT, SIGTERM, SIGKILL leftover |
| `refit export SRC OUT` over an earlier export | `.<out>.tmp-<pid>-*` beside it | error, SIGINT, SIGTERM, SIGKILL leftover |
| `safe_files.write_atomic` (every file write) | `.<name>.<random>.tmp` | SIGINT, SIGTERM |
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_catalogue import hf_source  # noqa: F401 (the session fixture)
from test_catalogue_safety import tree_state
from test_nemo_import_cli import _nemo_shaped

from nemo_fp8_rl.cli import refit as refit_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import nemo_import, safe_files
from nemo_fp8_rl.refit import export as export_mod

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def dead_pid() -> int:
    """The pid of a process that has ended (a SIGKILLed command's, for its leftovers)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    tmp = tmp_path / "TMPDIR"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    yield tmp


def ours(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("nemo-fp8-rl-"))


def signal_inside(monkeypatch, module, name: str, sig: int) -> list[bool]:
    """Wrap `module.name` so that it sends `sig` to this process once it has run (the
    temporary folder exists then); returns a list that records that it ran."""
    original, ran = getattr(module, name), []

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        ran.append(True)
        os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(module, name, wrapped)
    return ran


# --- train --recipe NEMO.yaml --dry-run: the on-the-fly import ----------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_the_import_folder_goes_on_a_signal(sig, tmp_path, tmpdir_env, monkeypatch, capsys):
    src = _nemo_shaped(tmp_path)
    ran = signal_inside(monkeypatch, nemo_import, "write_imported", sig)
    code = invoke(train_cli.main, ["--recipe", str(src), "--dry-run"])
    assert ran and code == 130, capsys.readouterr().err
    assert ours(tmpdir_env) == []


def test_the_import_folder_goes_on_an_error_and_the_error_names_the_users_file(
    tmp_path, tmpdir_env, capsys
):
    src = _nemo_shaped(tmp_path)
    code = invoke(train_cli.main, ["--recipe", str(src), "--dry-run", "grpo.max_num_stepz=3"])
    err = capsys.readouterr().err
    assert code == 2 and "max_num_stepz" in err and ours(tmpdir_env) == []
    assert "nemo-fp8-rl-import" not in err


def test_the_import_folder_goes_on_success(tmp_path, tmpdir_env, capsys):
    src = _nemo_shaped(tmp_path)
    invoke(train_cli.main, ["--recipe", str(src), "--dry-run"])
    assert "imported as a recipe" in capsys.readouterr().err and ours(tmpdir_env) == []


def test_an_import_folder_a_killed_command_left_is_removed_next_time(tmp_path, tmpdir_env):
    left = tmpdir_env / f"nemo-fp8-rl-import-{dead_pid()}-abc123"
    (left / "sub").mkdir(parents=True)
    live = tmpdir_env / f"nemo-fp8-rl-import-{os.getppid()}-def456"  # a running process's
    live.mkdir()
    src = _nemo_shaped(tmp_path)
    invoke(train_cli.main, ["--recipe", str(src), "--dry-run"])
    assert not left.exists() and live.exists()


# --- refit export over an earlier export -------------------------------------------------


def _earlier(tmp_path: Path, hf_source) -> tuple[Path, Path]:  # noqa: F811
    """A Hugging Face source folder and an earlier export of it at `tmp_path/out`."""
    from catalogue_cases import Workspace

    ws = Workspace(tmp_path, hf_source)
    return ws.hf("src"), ws.export("out")


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_refit_export_over_an_earlier_one_leaves_nothing_on_a_signal(
    sig,
    tmp_path,
    hf_source,  # noqa: F811
    monkeypatch,
    capsys,
):
    src, out = _earlier(tmp_path, hf_source)
    before = tree_state(out)
    ran = signal_inside(monkeypatch, export_mod, "export_checkpoint", sig)
    code = invoke(refit_cli.main, ["export", str(src), str(out)])
    assert ran and code == 130, capsys.readouterr().err
    assert tree_state(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")) == []


def test_refit_export_leaves_nothing_on_an_error(tmp_path, hf_source, monkeypatch, capsys):  # noqa: F811
    src, out = _earlier(tmp_path, hf_source)
    before = tree_state(out)
    (src / "config.json").write_text("{not json")
    code = invoke(refit_cli.main, ["export", str(src), str(out)])
    assert code in (1, 2) and "Traceback" not in capsys.readouterr().err
    assert tree_state(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_an_export_folder_a_killed_export_left_is_removed_next_time(tmp_path, hf_source):  # noqa: F811
    src, out = _earlier(tmp_path, hf_source)
    left = tmp_path / f".out.tmp-{dead_pid()}-abc123"
    left.mkdir()
    (left / "part-0.tmp").write_bytes(b"half")
    assert invoke(refit_cli.main, ["export", str(src), str(out)]) == 0
    assert not left.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


# --- the one file writer --------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_an_atomic_write_interrupted_keeps_the_old_file_and_no_temporary(sig, tmp_path):
    from nemo_fp8_rl.cli.common import _term_interrupts

    target = tmp_path / "report.md"
    target.write_text("old\n")

    def fill(handle) -> None:
        handle.write(b"half of the new")
        os.kill(os.getpid(), sig)

    previous = _term_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt):
            safe_files.write_atomic_with(target, fill)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    assert target.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["report.md"]
