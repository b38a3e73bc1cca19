"""Generated blocks in README and docs: the text between a begin and an end marker, replaced
by a committed script's output so that a docs test can regenerate and compare it."""

from __future__ import annotations

import re
from pathlib import Path

from nemo_fp8_rl.config.user_error import UsageError


class MarkersMissing(UsageError, ValueError):
    """A page without exactly one pair of a generated block's markers (exit 2)."""


def replace_block(text: str, marks: tuple[str, str], body: str, where: str) -> str:
    """`text` with the one block between the `marks` replaced by `body`, keeping the markers'
    line breaks (inline when they sit on one line, as inside README's evidence paragraph).
    Raises `MarkersMissing` naming `where` unless there is exactly one such block."""
    begin, end = marks
    pattern = re.escape(begin) + r"(\n?).*?(\n?)" + re.escape(end)
    new, count = re.subn(
        pattern, lambda m: f"{begin}{m[1]}{body}{m[2]}{end}", text, flags=re.DOTALL
    )
    if count != 1:
        raise MarkersMissing(
            where,
            f"expected one {begin} ... {end} block, found {count}; nothing was written",
            "put the two markers back around the generated text",
        )
    return new


def write_block(path: Path, marks: tuple[str, str], body: str) -> None:
    """Replace the block between `marks` in the file at `path` (atomic write)."""
    write_blocks(path, {marks: body})


def write_blocks(path: Path, bodies: dict[tuple[str, str], str]) -> None:
    """Replace every block `bodies` names in the file at `path`, in one atomic write made only
    when all of them were found (never through a link; a file of more than `MAX_PAGE` bytes or
    not UTF-8 text is refused, `read_page`)."""
    from nemo_fp8_rl.config.safe_files import write_atomic

    text = read_page(path)
    for marks, body in bodies.items():
        text = replace_block(text, marks, body, str(path))
    write_atomic(path, text)


MAX_PAGE = 8 * 2**20  # a README or a docs page is well below this


def read_page(path: Path) -> str:
    """The text of a docs page to splice into: a regular file (a pipe would block the read) of
    at most `MAX_PAGE` bytes, UTF-8; anything else is a located `UserError`."""
    from nemo_fp8_rl.config.safe_files import read_text_bounded

    return read_text_bounded(Path(path), MAX_PAGE, "docs page")
