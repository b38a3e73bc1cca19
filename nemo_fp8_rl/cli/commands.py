"""`python -m nemo_fp8_rl <command> ...`: every command under one name.

`python -m nemo_fp8_rl train --recipe R` is `nemo_fp8_rl.train --recipe R`; with no command (or
`--help`) it lists the commands. Each command is imported only when it is the one asked for.
"""

from __future__ import annotations

import importlib
import sys

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.usage import version
from nemo_fp8_rl.config.user_error import USAGE, UsageError

COMMANDS: dict[str, str] = {
    "train": "train a recipe (embedded CPU engine or NeMo RL)",
    "submit": "submit a recipe to Slurm; status, logs, cancel",
    "compare": "compare runs (metrics, plots, verdict) or recipes (what differs)",
    "recipes": "list, show, validate or copy recipes",
    "eval": "evaluate a checkpoint of a run on a benchmark suite",
    "refit": "export a checkpoint in the generation engine's FP8 layout",
    "study": "the CPU mechanism study over seeds, with its report",
    "env": "versions, GPUs and optional stacks, for a bug report",
    "completion": "a bash completion script for every command (eval it or save it)",
}


def usage() -> str:
    """The command list, as `--help` prints it."""
    width = max(map(len, COMMANDS))
    lines = [
        "usage: python -m nemo_fp8_rl <command> [arguments ...]",
        "",
        "commands (each is also the console script nemo_fp8_rl.<command>; <command> --help "
        "shows its flags):",
    ]
    lines += [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv[0]` with the rest of `argv`; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else USAGE
    if argv[0] == "--version":
        print(f"nemo_fp8_rl {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        unknown = UsageError(
            "python -m nemo_fp8_rl",
            f"unknown command {name!r}",
            f"give one of {', '.join(COMMANDS)} (python -m nemo_fp8_rl --help lists them)",
        )
        print(f"error: {unknown}", file=sys.stderr)
        return USAGE
    module = importlib.import_module(f"nemo_fp8_rl.cli.{name}")
    return invoke(module.main, rest, prog=f"nemo_fp8_rl.{name}")


def entry() -> None:
    """`python -m nemo_fp8_rl`."""
    sys.exit(main())
