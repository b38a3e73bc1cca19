"""Safe export output: write into a temporary folder next to the target, verify, then swap in.

An export never destroys anything by accident: a target that is a file, or a folder holding
files an export does not write, is refused before anything is written; the new export is built
in `.<name>.tmp-*` beside the target, verified (every shard opens, the index names exactly the
tensors in the shards, `config.json` parses), and only then renamed into place, the previous
export (if any) being moved aside first and deleted last. A failure at any point leaves the
target as it was. The export is readable like any checkpoint: its folders get mode
`0o777 & ~umask` and its files `0o666 & ~umask` (0755 and 0644 under the usual umask 022), not
the private 0700/0600 of the temporary folder and of the safetensors writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from nemo_fp8_rl.config.safe_files import check_folder, write_folder
from nemo_fp8_rl.config.user_error import UserError

INDEX = "model.safetensors.index.json"


class ExportError(UserError):
    """An export that was refused or failed; the target folder is unchanged."""


def check_output_path(out: Path) -> None:
    """Refuse a target that is a symbolic link (dangling, looping or not): the swap would
    replace the link, not the folder it names, and a loop names nothing."""
    if out.is_symlink():
        raise ExportError(
            out,
            f"is a symbolic link (to {os.readlink(out)}); nothing was written",
            "give the folder the export should be, not a link to it",
            2,
        )
    check_folder(out, "export folder")


def check_target(out: Path, own_files: Iterable[str]) -> None:
    """Refuse a target that is a file, or a non-empty folder that is not an earlier export."""
    if out.exists() and not out.is_dir():
        raise ExportError(out, "is a file, not a folder", "give a folder path for the export", 2)
    if not out.is_dir():
        return
    allowed = set(own_files) | {"config.json", INDEX}
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if p.name not in allowed and not (p.name.startswith("model") and p.suffix == ".safetensors")
    )
    looks_exported = (out / INDEX).is_file() and (out / "config.json").is_file()
    if foreign or (any(out.iterdir()) and not looks_exported):
        shown = ", ".join(foreign[:5]) or "files without an export index"
        raise ExportError(
            out,
            f"folder holds files that are not an earlier export ({shown}); nothing was written",
            "export into a new or empty folder, or into an earlier export to replace it",
            2,
        )


def write_swapped(out: Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)` into a temporary folder beside `out`, verify it, then swap it in
    (`safe_files.write_folder`)."""

    def build(tmp: Path) -> None:
        write(tmp)
        verify_export(tmp)
        publish_modes(tmp)

    write_folder(out, build, "export")


def current_umask() -> int:
    """The process umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_modes(folder: Path) -> None:
    """Give `folder` and everything below it the modes a new folder and file get under the umask."""
    mask = current_umask()
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def verify_export(folder: Path) -> None:
    """Every shard opens and the index names exactly the tensors the shards hold."""
    from safetensors import safe_open

    try:
        index = json.loads((folder / INDEX).read_text())["weight_map"]
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(folder, f"export incomplete ({exc})", "run the export again") from exc
    found: dict[str, str] = {}
    for shard in sorted(set(index.values())):
        try:
            with safe_open(folder / shard, framework="pt") as f:
                found.update(dict.fromkeys(f.keys(), shard))  # noqa: SIM118
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error type)
            raise ExportError(
                folder / shard, f"written shard does not read back ({exc})", "run the export again"
            ) from exc
    if found != index:
        raise ExportError(
            folder, "index and shards disagree after writing", "run the export again (disk full?)"
        )
