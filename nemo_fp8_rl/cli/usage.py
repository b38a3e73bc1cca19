"""What every command's `--help` ends with: examples and the exit codes, in one place.

`EXIT_CODES` is the one table of exit codes; docs/commands.md's "Exit codes" section repeats it and a test
checks that the two agree.
"""

from __future__ import annotations

import textwrap
from importlib import metadata

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (
        1,
        "runtime failure: a file that cannot be read, a checkpoint that fails verification, "
        "a Slurm command or a run that failed",
    ),
    (2, "usage or configuration error, found before anything ran"),
    (3, "the NeMo RL engine is not usable here (a GPU recipe, or --preflight, without NeMo RL)"),
    (130, "interrupted (Ctrl-C, or SIGTERM from kill or a scheduler, during a run)"),
    (141, "the output pipe was closed early (e.g. piped into head); nothing is printed"),
)

ERROR_LINE = "A failure prints one line: error: <where>: <what>. Fix: <how>."
DEBUG = "--debug (or NEMO_FP8_RL_DEBUG=1) adds the traceback."


def version() -> str:
    """The installed package's version (`unknown` when run from a tree that was never installed)."""
    try:
        return metadata.version("nemo-fp8-rl")
    except metadata.PackageNotFoundError:
        return "unknown"


def epilog(examples: list[str]) -> str:
    """The text after the options in `--help`: examples (as given, so that they can be pasted),
    the error line, the exit codes."""
    lines = ["example:" if len(examples) == 1 else "examples:"]
    lines += [f"  {e}" for e in examples]
    lines += ["", ERROR_LINE, DEBUG, "", "exit codes:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(
            meaning, width=92, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7
        )
    return "\n".join(lines)
