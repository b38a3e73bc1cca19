"""Atomic checkpoints: `checkpoints/step_<k>/` plus `checkpoints/latest` naming the newest.

A checkpoint is written into a temporary directory, fsynced, then renamed to `step_<k>`; only
then is `latest` replaced (write a temporary file, fsync, rename). A process killed at any
moment therefore leaves `latest` naming a complete checkpoint (or no `latest` at all), and
leftover temporary directories are ignored and cleaned up on the next save.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
INFO_FILE = "info.json"


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (rename durability)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: Path, step: int, state: dict[str, Any], info: dict[str, Any]) -> Path:
    """Write `state` (torch-serialisable) and `info` (JSON) as `root/step_<step>` atomically.

    `step` is the number of completed GRPO steps; resuming from it starts at step `step`.
    """
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_step_{step}_", dir=root))
    with (tmp / STATE_FILE).open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    with (tmp / INFO_FILE).open("w", encoding="utf-8") as f:
        json.dump({"step": step, **info}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_latest(root, final.name)
    return final


def _write_latest(root: Path, name: str) -> None:
    """Point `root/latest` at `name` with an atomic replace."""
    fd, tmp = tempfile.mkstemp(prefix=".latest_", dir=root)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / "latest")
    _fsync_dir(root)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint directory `root/latest` names, or None if there is none yet."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not (path / STATE_FILE).exists() or not (path / INFO_FILE).exists():
        raise FileNotFoundError(
            f"{pointer} names {path.name}, which is incomplete or missing; remove {pointer} "
            "to start over or restore that directory"
        )
    return path


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read `(state, info)` from a checkpoint directory."""
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    return state, info


def prune_checkpoints(root: Path, keep_top_k: int | None, metric: str | None) -> list[Path]:
    """Delete all but the `keep_top_k` best checkpoints by `info[metric]` (higher is better).

    Checkpoints without the metric rank by step; the one `latest` names is never deleted.
    Returns the deleted directories.
    """
    if keep_top_k is None:
        return []
    latest = latest_checkpoint(root)
    ranked = []
    for d in root.glob("step_*"):
        if (d / INFO_FILE).exists():
            info = json.loads((d / INFO_FILE).read_text(encoding="utf-8"))
            score = info.get(metric) if metric else None
            ranked.append(((score is not None, score or 0.0, info["step"]), d))
    ranked.sort(key=lambda x: x[0], reverse=True)
    doomed = [d for _, d in ranked[keep_top_k:] if latest is None or d != latest]
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)
    return doomed
