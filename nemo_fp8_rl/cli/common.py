"""Pieces every command shares: recipe arguments, trailing overrides, and the one error path.

`invoke(main, argv)` runs a command's `main` and turns every failure into one line on stderr,
`error: <where>: <what>. Fix: <how>`, with exit code 2 (usage, configuration) or 1 (runtime);
an unexpected exception is reported as an internal error with where to report it. `--debug`
(or `NEMO_FP8_RL_DEBUG=1`) also prints the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable

from nemo_fp8_rl.config.user_error import RUNTIME, USAGE, UserError

REPORT_TO = "the nemo-fp8-rl issue tracker"

Main = Callable[[list[str] | None], int]


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error line: `error: <prog>: <what>. Fix: see --help` (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"error: {self.prog}: {message}. Fix: see `{self.prog} --help`.\n")


def add_recipe_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """`--recipe R` plus trailing `dotted.key=value` overrides."""
    parser.add_argument(
        "--recipe",
        required=required,
        help="recipe path or short name, e.g. tiny/grpo-tiny-qwen3-cpu-fp8",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, checked by the same schema",
    )


def _known(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for the failures a user can cause; None for an internal error."""
    from nemo_fp8_rl.config import RecipeError

    if isinstance(exc, UserError):
        return exc.code, str(exc)
    if isinstance(exc, RecipeError):
        return USAGE, str(exc)
    # Matched by class name, so that reporting an error never imports the module defining it
    # (the Slurm, refit and engine modules pull in torch or Ray).
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {
        "JobSpecError",
        "RunReadError",
        "EngineConfigError",
        "HandoffError",
        "RefitPlanError",
        "MappingError",
    }:
        return USAGE, str(exc)
    if names & {"SlurmError", "RefitError", "EngineUnavailable"}:
        return RUNTIME, str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return RUNTIME, f"input: not a text file ({exc.reason}). Fix: pass a UTF-8 text file."
    if isinstance(exc, OSError):
        where = exc.filename or "file system"
        what = exc.strerror or str(exc)
        return RUNTIME, f"{where}: {what}. Fix: check the path, its permissions and free space."
    return None


def invoke(main: Main, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run `main(argv)` and return its exit code; every failure becomes one `error:` line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("NEMO_FP8_RL_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    prog = prog or getattr(main, "__module__", "nemo_fp8_rl").replace(".cli.", ".")
    try:
        return main(argv)
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else USAGE)
    except KeyboardInterrupt:
        print(
            f"error: {prog}: interrupted. Fix: run it again (with --resume to continue a run).",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:  # noqa: BLE001 (the one place every failure is reported)
        known = _known(exc)
        if debug:
            traceback.print_exc()
        if known is not None:
            code, message = known
            print(f"error: {message}", file=sys.stderr)
            return code
        print(
            f"error: {prog}: internal error ({type(exc).__name__}: {exc}). This is a bug in "
            f"nemo-fp8-rl, not a problem with your input. Fix: please report it on {REPORT_TO} "
            "with the command line and its output with --debug.",
            file=sys.stderr,
        )
        return RUNTIME


def run_main(main: Main) -> Callable[[], None]:
    """Console-script wrapper: `sys.exit(invoke(main))`."""

    def entry() -> None:
        sys.exit(invoke(main))

    return entry
