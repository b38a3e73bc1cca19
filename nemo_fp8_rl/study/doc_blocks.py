"""Generated blocks in README and docs: the text between a begin and an end marker, replaced
by a committed script's output so that a docs test can regenerate and compare it."""

from __future__ import annotations

import re
from pathlib import Path


def replace_block(text: str, marks: tuple[str, str], body: str, where: str) -> str:
    """`text` with the one block between the `marks` replaced by `body`, keeping the markers'
    line breaks (inline when they sit on one line, as inside README's evidence paragraph).
    Raises ValueError naming `where` unless there is exactly one such block."""
    begin, end = marks
    pattern = re.escape(begin) + r"(\n?).*?(\n?)" + re.escape(end)
    new, count = re.subn(
        pattern, lambda m: f"{begin}{m[1]}{body}{m[2]}{end}", text, flags=re.DOTALL
    )
    if count != 1:
        raise ValueError(
            f"{where}: expected one {begin} ... {end} block, found {count}; "
            "put the two markers back around the generated text"
        )
    return new


def write_block(path: Path, marks: tuple[str, str], body: str) -> None:
    """Replace the block between `marks` in the file at `path` (atomic write)."""
    from nemo_fp8_rl.config.safe_files import write_atomic

    text = path.read_text(encoding="utf-8")
    write_atomic(path, replace_block(text, marks, body, str(path)))
