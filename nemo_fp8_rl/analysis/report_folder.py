"""The folder a comparison writes into: named after every input, and never taken from another
comparison or from files `compare` did not write.

Default name: `results/compare-<name 1>-vs-<name 2>[-vs-...]-<hash>`, the readable names (cut
to `MAX_NAMES` characters) followed by the first 8 hex digits of SHA-256 over the kind of
comparison and the resolved input paths, one per line. `compare A B C`, `compare A B` and a
seed-group comparison of the same recipes so get different folders, and the same command the
same folder again.

`inputs.json` in the folder records what it holds: the kind, the inputs, the runs they stand for
and the files the comparison wrote. A folder is taken when it is new or empty, or when its record
names the same kind and inputs (the same comparison, written again); anything else (another
comparison, or files without a record, such as a report.md written by hand) is refused unless
`overwrite`. Before writing again, the files of the recorded comparison are removed, so no stale
plot or table of an earlier comparison stays behind; files it did not record are never removed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_fp8_rl.config.safe_files import check_folder, write_atomic
from nemo_fp8_rl.config.user_error import UsageError

RECORD = "inputs.json"
MAX_NAMES = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def input_path(item: str | Path) -> str:
    """An input as an absolute path; a metrics or event file stands for its run folder."""
    path = Path(item).resolve()
    return str(path.parent if path.is_file() else path)


def default_folder(
    names: Sequence[str], inputs: Sequence[str], kind: str, root: Path = Path("results")
) -> Path:
    """`root/compare-<names joined by -vs->-<8 hex digits of the inputs' hash>`."""
    digest = hashlib.sha256("\n".join([kind, *inputs]).encode()).hexdigest()[:8]
    parts = [_UNSAFE.sub("_", n).strip("_") or "run" for n in names]
    shown: list[str] = []
    for part in parts:
        if shown and len("-vs-".join([*shown, part])) > MAX_NAMES:
            break
        shown.append(part)
    readable = "-vs-".join(shown)
    if len(shown) < len(parts):
        readable += f"-and-{len(parts) - len(shown)}-more"
    return root / f"compare-{readable}-{digest}"


def _files(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file below `folder` (relative path) with its inode, size and modification time."""
    out = {}
    for path in folder.rglob("*") if folder.is_dir() else []:
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            out[str(path.relative_to(folder))] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _read_record(folder: Path) -> dict | None:
    """The folder's `inputs.json`, or None when it has none or it does not read as a record."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        return None
    return record


@dataclass
class ReportFolder:
    """A folder claimed for one comparison; `record()` after writing lists what was written."""

    path: Path
    kind: str
    inputs: list[str]
    runs: list[str] = field(default_factory=list)
    before: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)

    def record(self) -> Path:
        """Write `inputs.json`: the inputs, every file written since the claim and the earlier
        plots kept (`claim(keep_plots=True)`)."""
        now = _files(self.path)
        written = sorted(
            {rel for rel, stat in now.items() if rel != RECORD and self.before.get(rel) != stat}
            | {rel for rel in self.kept if rel in now}
        )
        record = {"kind": self.kind, "inputs": self.inputs, "runs": self.runs, "files": written}
        target = self.path / RECORD
        write_atomic(target, json.dumps(record, indent=1) + "\n")
        return target


def _remove_recorded(folder: Path, record: dict, keep_plots: bool = False) -> list[str]:
    """Delete the files an earlier comparison recorded (only files inside `folder`), except
    with `keep_plots` its plots (the PNGs the reports write at the folder's top level; any
    other recorded file is stale); returns the files kept."""
    root = folder.resolve()
    kept = []
    for rel in record["files"]:
        path = (folder / str(rel)).resolve()
        if root in path.parents and path.is_file():
            if keep_plots and path.suffix == ".png" and "/" not in str(rel):
                kept.append(str(rel))
            else:
                path.unlink()
    return kept


def _refuse_links(folder: Path) -> None:
    """A report folder holding a symbolic link is refused: writing a report there could
    write through it into a file outside the folder."""
    links = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_symlink())
    if folder.is_dir() and links:
        raise UsageError(
            f"--out {folder}",
            f"holds symbolic links ({', '.join(links[:4])}); nothing was written",
            "remove the links, or give --out a new folder",
        )


def claim(
    folder: Path,
    kind: str,
    inputs: Sequence[str],
    runs: Sequence[str] = (),
    overwrite: bool = False,
    keep_plots: bool = False,
) -> ReportFolder:
    """Take `folder` for a comparison of `inputs`, or raise `UsageError` (nothing written).

    New, empty, or holding the record of the same kind and inputs: taken (the recorded files
    are removed first, except the earlier PNG plots with `keep_plots`: a comparison that draws
    no plots, `--no-plots`, does not take away those of an earlier one of the same inputs).
    Holding anything else: refused unless `overwrite`.
    """
    check_folder(folder, "report folder")
    if folder.exists() and not folder.is_dir():
        raise UsageError(
            f"--out {folder}", "is a file, not a folder", "give a folder for the report"
        )
    _refuse_links(folder)
    record = _read_record(folder)
    same = record is not None and record.get("kind") == kind and record.get("inputs") == inputs
    present = sorted(_files(folder))
    if present and not same and not overwrite:
        if record is not None:
            held = ", ".join(map(str, record.get("inputs") or [])) or "unknown inputs"
            what = f"holds another comparison ({record.get('kind')} of {held}; see {RECORD})"
        else:
            shown = ", ".join(present[:4]) + (
                f" and {len(present) - 4} more" if len(present) > 4 else ""
            )
            what = f"holds files this comparison did not write ({shown})"
        raise UsageError(
            f"--out {folder}",
            f"{what}; nothing was written",
            "give --out a new folder, or add --overwrite to write over it",
        )
    kept = _remove_recorded(folder, record, keep_plots and same) if record is not None else []
    folder.mkdir(parents=True, exist_ok=True)
    return ReportFolder(folder, kind, list(inputs), list(runs), _files(folder), kept)
