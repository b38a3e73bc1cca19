"""One training process per run directory: an OS file lock on `<run dir>/.run.lock`.

`hold(run_dir)` takes an exclusive `flock` on the lock file, or refuses with the holder's pid
and command line. The kernel releases the lock when the process ends, however it ends (normal
exit, an exception, SIGKILL), so a crashed run never leaves a stale lock behind; the file
itself stays (an empty-looking `.run.lock` means nothing).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from nemo_fp8_rl.config.safe_files import check_folder, open_nofollow
from nemo_fp8_rl.config.user_error import UsageError

LOCK_NAME = ".run.lock"

# Locks this process holds, by run dir: kept open until `release` or the process ends.
_HELD: dict[Path, int] = {}


class RunDirBusy(UsageError):
    """Another process is training in this run directory (exit code 2)."""


def hold(run_dir: Path) -> Path:
    """Lock `run_dir` (created if missing) for this process; returns the lock file's path.

    Raises:
        RunDirBusy: another live process holds the lock; the message names it.
    """
    run_dir = check_folder(run_dir, "run folder")
    if run_dir in _HELD:
        return run_dir / LOCK_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a link planted here is refused
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        error = _busy(run_dir, fd)
        os.close(fd)
        raise error from None
    os.ftruncate(fd, 0)
    info = {
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:500],
    }
    os.write(fd, (json.dumps(info) + "\n").encode())
    _HELD[run_dir] = fd
    return path


def release(run_dir: Path) -> None:
    """Give up this process's lock on `run_dir` (no-op when not held)."""
    fd = _HELD.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_free(run_dir: Path) -> None:
    """Raise `RunDirBusy` when another process holds `run_dir`'s lock; creates nothing."""
    run_dir = check_folder(run_dir, "run folder")
    path = run_dir / LOCK_NAME
    if run_dir in _HELD or not (path.is_file() or path.is_symlink()):
        return
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        raise _busy(run_dir, fd) from None
    finally:
        os.close(fd)


def _busy(run_dir: Path, fd: int) -> RunDirBusy:
    return RunDirBusy(
        run_dir,
        f"another training process is running in this folder ({_describe(fd)}); nothing was "
        "written",
        "wait for it to finish, or stop it first, or pass --run-dir with another folder",
    )


def _describe(fd: int) -> str:
    """`pid 123, started 2026-01-01 10:00:00: nemo_fp8_rl.train ...` from the lock file."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "holder unknown"
    return f"pid {info['pid']}, started {info.get('started', '?')}: {info.get('command', '?')}"
