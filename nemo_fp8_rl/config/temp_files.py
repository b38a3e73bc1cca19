"""Temporary folders the project creates: removed on success, error, Ctrl-C and SIGTERM, and
named so that a later run removes what a killed one (SIGKILL, a power cut) left behind.

`temporary_folder(kind)` makes `<TMPDIR>/nemo-fp8-rl-<kind>-<pid>-<random>` and removes it when
the block ends, however it ends (the commands turn SIGTERM into the interrupt Ctrl-C raises,
`cli.common.invoke`, so both reach the clean-up). Before making one it removes every
`nemo-fp8-rl-<kind>-<pid>-*` folder of this user whose process is gone (`sweep`): the only
thing SIGKILL leaves is found and removed by the next command of the same kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "nemo-fp8-rl-"
_NAME = re.compile(rf"{PREFIX}(?P<kind>[a-z0-9]+)-(?P<pid>\d+)-\w+")


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(kind: str, root: Path | None = None) -> list[Path]:
    """Remove the `kind` folders in `root` (TMPDIR) left by processes that no longer run and
    owned by this user (never a link); returns what was removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for entry in root.glob(f"{PREFIX}{kind}-*"):
        m = _NAME.fullmatch(entry.name)
        if not m or m["kind"] != kind or entry.is_symlink() or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid != os.getuid() or _alive(int(m["pid"])):
                continue
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def temporary_folder(kind: str, root: Path | None = None) -> Iterator[Path]:
    """A new private folder (mode 0700) for the block, removed when it ends (module docstring)."""
    sweep(kind, root)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # ours: made by mkdtemp above


def sibling_prefix(target: Path, tag: str) -> str:
    """The name prefix of a temporary sibling of `target` (`.<name>.<tag>-<pid>-`): hidden,
    next to what it replaces (one file system, so the final rename is atomic)."""
    return f".{Path(target).name}.{tag}-{os.getpid()}-"


def sweep_siblings(target: Path, tag: str) -> list[Path]:
    """Remove `.<name>.<tag>-<pid>-*` siblings of `target` whose process is gone and that
    belong to this user (never a link): what a killed writer of `target` left."""
    target = Path(target)
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(tag)}-(\d+)-\w+")
    removed = []
    if not target.parent.is_dir():
        return removed
    for entry in target.parent.glob(f".{glob_escape(target.name)}.{tag}-*"):
        m = pattern.fullmatch(entry.name)
        if not m or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid != os.getuid() or _alive(int(m[1])):
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed


def glob_escape(name: str) -> str:
    """`name` with glob's special characters taken literally."""
    import glob

    return glob.escape(name)
