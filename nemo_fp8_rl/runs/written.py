"""A folder a command writes named files into (`study --report DIR`), claimed through a record.

`claim(folder, overwrite)` runs before anything is computed or written. It refuses `/` and the
home folder (a report's `tables.md` and plots would land among the user's own files), a path
that is a file or a symbolic link, and a folder holding files this command did not write (no
record names them: a user's `tables.md` would otherwise be replaced by name) unless
`overwrite`. `record(folder, files)` then lists, in `RECORD`, every file the command wrote, so
that writing the same report again is not a refusal. Nothing here deletes anything: with
`overwrite` the named files are replaced, and every other file stays.
"""

from __future__ import annotations

import json
from pathlib import Path

from nemo_fp8_rl.config.output_paths import protected_folders
from nemo_fp8_rl.config.safe_files import check_folder, refuse_link, write_atomic
from nemo_fp8_rl.config.user_error import UsageError

RECORD = "written-by-nemo-fp8-rl.json"
MAX_SHOWN = 5


def recorded(folder: Path) -> set[str]:
    """The files `RECORD` in `folder` names (empty when it has none or it does not read)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    files = data.get("files") if isinstance(data, dict) else None
    return {str(f) for f in files} if isinstance(files, list) else set()


def foreign(folder: Path) -> list[str]:
    """Entries of `folder` the record does not name (the record itself excepted), sorted."""
    if not folder.is_dir():
        return []
    mine = recorded(folder) | {RECORD}
    return sorted(p.name for p in folder.iterdir() if p.name not in mine)


def claim(folder: Path, flag: str, overwrite: bool) -> None:
    """Refuse `folder` as an output folder for `flag` (module docstring); nothing is written."""
    refuse_link(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(folder, "is a file, not a folder", f"pass {flag} with a folder path")
    if check_folder(folder) in protected_folders():
        raise UsageError(
            f"{flag} {folder}",
            "is the root or home folder, which a report must not write into",
            f"pass {flag} with a folder of its own (e.g. {flag} /tmp/report)",
        )
    theirs = foreign(folder)
    if theirs and not overwrite:
        shown = ", ".join(theirs[:MAX_SHOWN])
        more = f", and {len(theirs) - MAX_SHOWN} more" if len(theirs) > MAX_SHOWN else ""
        raise UsageError(
            f"{flag} {folder}",
            f"holds files this command did not write ({shown}{more}); nothing was written",
            f"pass {flag} with a new or empty folder, or --overwrite to replace files of the "
            "same names there (others stay)",
        )


def record(folder: Path, files: list[Path]) -> None:
    """Add `files` (inside `folder`) to its `RECORD`."""
    names = recorded(folder) | {Path(f).name for f in files}
    write_atomic(folder / RECORD, json.dumps({"files": sorted(names)}, indent=1) + "\n")
