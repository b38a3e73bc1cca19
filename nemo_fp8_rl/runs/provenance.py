"""Run provenance: which code ran, when, on what machine and under what load.

A snapshot records the code commit of the checkout the package was imported from and whether its
tree was dirty (uncommitted changes to tracked files, or untracked files outside the ignored
ones), the UTC time, the 1-minute load average, and the machine (CPU model, logical cores). A run
records one snapshot when it starts and one when it ends (`environment.json`, key `provenance`),
so that an archived result can be checked against the commit that made it and its wall time read
beside the load it ran under. Outside a git checkout (an installed wheel) `commit` is None.
"""

from __future__ import annotations

import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def git(root: Path, *args: str) -> str | None:
    """Output of `git -C root <args>` (stripped), None when git fails or is absent."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_state() -> dict[str, Any]:
    """{"commit": HEAD or None, "dirty": bool or None} of the checkout holding this package."""
    commit = git(PACKAGE_ROOT, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git(PACKAGE_ROOT, "status", "--porcelain", "--untracked-files=normal")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


@lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """CPU model (from /proc/cpuinfo where it exists) and logical cores."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split("\n"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count()}


def load1() -> float | None:
    """The 1-minute load average, None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def snapshot() -> dict[str, Any]:
    """Code state, UTC time, 1-minute load and machine, now."""
    return {
        **code_state(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load1": load1(),
        **machine(),
    }
