"""Atomic checkpoints: `checkpoints/step_<k>/` plus `checkpoints/latest` naming the newest.

A checkpoint is written into a temporary directory, fsynced, then renamed to `step_<k>`; only
then is `latest` replaced (write a temporary file, fsync, rename). A process killed at any
moment therefore leaves `latest` naming a complete checkpoint (or no `latest` at all), and
leftover temporary directories are ignored and cleaned up on the next save.

Each checkpoint carries `manifest.json`: the recipe it belongs to, its step, and the size and
SHA-256 of every file. `resume_point` verifies it before anything is loaded or written, and
refuses, saying what to do, a missing `latest`, a checksum mismatch (bit flip, truncation),
another recipe's checkpoint, or a run asked for fewer steps than it already completed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import located_disk_full, refuse_link, write_atomic
from nemo_fp8_rl.config.user_error import CheckpointError

STATE_FILE = "state.pt"
INFO_FILE = "info.json"
MANIFEST_FILE = "manifest.json"


def _digest(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of one file (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON into a new file of the checkpoint's own temporary folder."""
    with path.open("w", encoding="utf-8") as f:  # safe-write: private
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


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
    for stale in root.glob(".tmp_step_*"):  # ours: an interrupted save's own folders
        if not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step}"
    refuse_link(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_step_{step}_", dir=root))
    try:
        with located_disk_full(final, "the earlier checkpoints are kept"):
            _write_step(tmp, step, state, info)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # ours: made by mkdtemp above
        raise
    if final.exists():
        shutil.rmtree(final)  # this run's own step_<step>, saved again
    os.rename(tmp, final)  # safe-write: rename (mkdtemp folder)
    _fsync_dir(root)
    _write_latest(root, final.name)
    return final


def _write_step(tmp: Path, step: int, state: dict[str, Any], info: dict[str, Any]) -> None:
    """`state.pt`, `info.json` and the manifest of their digests, into the new folder `tmp`."""
    import torch

    with (tmp / STATE_FILE).open("wb") as f:  # safe-write: private
        torch.save(state, f)  # safe-write: private
        f.flush()
        os.fsync(f.fileno())
    _write_json(tmp / INFO_FILE, {"step": step, **info})
    manifest = {
        "step": step,
        "recipe": info.get("recipe"),
        "files": {name: _digest(tmp / name) for name in (STATE_FILE, INFO_FILE)},
    }
    _write_json(tmp / MANIFEST_FILE, manifest)


def _write_latest(root: Path, name: str) -> None:
    """Point `root/latest` at `name` with an atomic replace (a link there is refused)."""
    write_atomic(root / "latest", name + "\n")
    _fsync_dir(root)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint directory `root/latest` names, or None if there is none yet."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            pointer, f"cannot read it ({exc})", _RESTORE.format(root=root)
        ) from exc
    path = root / name
    if (
        not name
        or "/" in name
        or not (path / STATE_FILE).exists()
        or not (path / INFO_FILE).exists()
    ):
        raise CheckpointError(
            pointer,
            f"names {name!r}, which is incomplete or missing",
            _RESTORE.format(root=root),
        )
    return path


_RESTORE = (
    "point it at a complete checkpoint (`ls {root}`; `echo step_N > {root}/latest`), or start "
    "the run over with --overwrite instead of --resume"
)


def resume_point(root: Path, recipe: str, max_steps: int) -> Path:
    """The verified checkpoint `--resume` continues from; a `CheckpointError` says what is wrong.

    Refused: no checkpoint at all, `latest` missing or dangling, a manifest that is missing or
    does not match the files (size or SHA-256), another recipe's checkpoint, and a checkpoint
    that already completed more than `max_steps` steps.
    """
    steps = sorted(root.glob("step_*")) if root.is_dir() else []
    if not (root / "latest").exists():
        if not steps:
            raise CheckpointError(
                root,
                "--resume given but the run has no checkpoint",
                "run without --resume (add --overwrite to start the run over)",
            )
        raise CheckpointError(
            root / "latest",
            f"missing, so the newest checkpoint is unknown ({', '.join(p.name for p in steps)} present)",
            _RESTORE.format(root=root),
        )
    path = latest_checkpoint(root)
    assert path is not None
    verify_checkpoint(path)
    manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    if manifest.get("recipe") != recipe:
        raise CheckpointError(
            path,
            f"belongs to recipe {manifest.get('recipe')!r}, not {recipe!r}",
            "resume with the recipe that wrote it, or start this run over with --overwrite",
        )
    done = int(manifest["step"])
    if done > max_steps:
        raise CheckpointError(
            path,
            f"the run already completed {done} steps but grpo.max_num_steps is {max_steps}",
            f"set grpo.max_num_steps={done} or more to continue it",
            code=2,
        )
    return path


def verify_checkpoint(path: Path) -> None:
    """Check `path` against its manifest: every file present with its size and SHA-256."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
        int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            path / MANIFEST_FILE,
            f"missing or unreadable ({type(exc).__name__}), so the checkpoint cannot be verified",
            _RESTORE.format(root=path.parent),
        ) from exc
    for name, want in files.items():
        file = path / name
        got = _digest(file) if file.is_file() else None
        if got != want:
            what = (
                "missing"
                if got is None
                else (
                    f"{got['bytes']} bytes, expected {want.get('bytes')} (truncated?)"
                    if got["bytes"] != want.get("bytes")
                    else "fails its SHA-256 checksum (corrupted)"
                )
            )
            raise CheckpointError(file, what, _RESTORE.format(root=path.parent))


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read `(state, info)` from a checkpoint directory."""
    import torch

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
    doomed = [
        d for _, d in ranked[keep_top_k:] if (latest is None or d != latest) and not d.is_symlink()
    ]
    for d in doomed:  # this run's own step_* folders (a link is never followed)
        shutil.rmtree(d, ignore_errors=True)
    return doomed
