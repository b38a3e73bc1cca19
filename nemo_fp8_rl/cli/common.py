"""Pieces every command shares: the parser, recipe arguments, overrides, and the one error path.

`invoke(main, argv)` runs a command's `main` and turns every failure into one line on stderr,
`error: <where>: <what>. Fix: <how>`, with the exit codes of `usage.EXIT_CODES` (2 usage or
configuration, 1 runtime, 3 engine not usable); an unexpected exception is reported as an
internal error with where to report it. `--debug` (or `NEMO_FP8_RL_DEBUG=1`) also prints the
traceback. Output into a pipe that closed early (`| head`) ends the command quietly with 141,
the status the shell shows for a program killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import math
import os
import select
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable
from typing import Any

from nemo_fp8_rl.cli.usage import epilog, version
from nemo_fp8_rl.config.user_error import RUNTIME, USAGE, UsageError, UserError, shown

REPORT_TO = "the nemo-fp8-rl issue tracker"


def report_to() -> str:
    """Where to report a bug: the `Issues` address of `[project.urls]` when the installed
    package has one, else the tracker by name."""
    from importlib import metadata

    try:
        urls = metadata.metadata("nemo-fp8-rl").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("issues", "bug tracker"):
            return url.strip()
    return REPORT_TO


Main = Callable[[list[str] | None], int]


PIPE_CLOSED = 128 + 13  # what the shell reports for a program killed by SIGPIPE
# The one seed syntax of every command that takes --seeds.
SEEDS_SYNTAX = "a comma-separated list and/or inclusive ranges, e.g. 1-3 or 1,2,5 or 1-3,7"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; option help wrapped without breaking names at hyphens
    (a recipe name stays on one line, so it can be copied)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error line (`error: <prog>: <what>. Fix: see --help`, exit 2)
    and, given `examples`, an epilog of examples and exit codes; a top-level parser (`top`) also
    gets `--version` and `--debug`. Sub-command parsers are of this class too."""

    def __init__(self, *args: Any, examples: list[str] | None = None, top: bool = True, **kw: Any):
        kw.setdefault("formatter_class", HelpFormatter)
        if examples is not None:
            kw["epilog"] = epilog(examples)
        super().__init__(*args, **kw)
        if top and examples is not None:
            self.add_argument("--version", action="version", version=f"%(prog)s {version()}")
            self.add_argument(
                "--debug", action="store_true", help="on a failure, also print the traceback"
            )

    def add_subparsers(self, **kw: Any) -> Any:
        """Sub-command parsers are `SubcommandParser`s (no --version or --debug of their own)."""
        kw.setdefault("parser_class", SubcommandParser)
        # A sub-command's usage line starts with this command's name, not with its whole usage
        # line (argparse's default, which repeats `{list,show,...} ...` before the sub-command).
        kw.setdefault("prog", self.prog)
        return super().add_subparsers(**kw)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        refused = UsageError(self.prog, message, f"see `{self.prog} --help`")
        self.exit(USAGE, f"error: {refused}\n")


class SubcommandParser(ArgumentParser):
    """The parser of one sub-command (`recipes list`, `refit export`)."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, top=False, **kw)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (`--num-problems`, `--jobs`)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


MAX_WAIT_S = 24 * 3600.0  # the longest wait or poll any command takes (`cancel --wait`)


def wait_seconds(text: str) -> float:
    """An argparse type: seconds in (0, `MAX_WAIT_S`] (`--wait`); inf, nan, 1e308 or a negative
    number would make a wait that never ends (in practice) or never starts."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds > 0 and at most {MAX_WAIT_S:g} (a day), "
            f"got {shown(text)!r}"
        )
    return value


def int_up_to(high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [1, `high`] (`eval --samples`: a bound on work)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high:,}, got {shown(text)}")
        return value

    parse.__name__ = f"whole number in [1, {high}]"
    return parse


class OneRecipe(argparse.Action):
    """`--recipe`/`--config` given once: a second one (`--config A --recipe B`) would silently
    pick one of two recipe sources, so it is refused."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None and earlier != self.default:
            parser.error(
                f"{option_string} {values}: the recipe was already given ({earlier!r}); "
                "--recipe and --config name the same thing, pass one of them once"
            )
        setattr(namespace, self.dest, values)


def add_recipe_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """`--recipe R` (or NeMo RL's `--config R`) plus trailing `dotted.key=value` and `~dotted.key` overrides."""
    parser.add_argument(
        "--recipe",
        "--config",  # NeMo RL's own scripts take the config as --config
        dest="recipe",
        action=OneRecipe,
        required=required,
        help="recipe path or short name, e.g. tiny/grpo-tiny-qwen3-cpu-fp8 (--config: the same; "
        "given once)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],  # without a default argparse calls a `*` positional "required"
        metavar="key=value|~key",
        help="overrides, in Hydra's syntax as NeMo RL takes them: dotted.key=value sets a key, "
        "+dotted.key=value adds one the recipe does not have (refused on one it has), "
        "++dotted.key=value adds or sets, ~dotted.key deletes. What differs from NeMo RL: the "
        "schema, not the prefix, decides which keys exist, so + adds only a key of NeMo RL's "
        "config classes or inside a free-form section (env, *.env_vars, vllm_kwargs, "
        "hf_config_overrides, slurm.env), where NeMo RL's + adds any key and ignores one it "
        "does not read; and key=value also sets such a key the recipe leaves out, where NeMo "
        "RL needs +",
    )


def add_gpu_arg(parser: argparse.ArgumentParser) -> None:
    """`--gpu TYPE`: the workers' GPU type, which the FP8 guard rails decide for (sets slurm.gpu)."""
    from nemo_fp8_rl.config.gpus import gpu_names

    parser.add_argument(
        "--gpu",
        metavar="TYPE",
        type=gpu_type,
        help=f"the workers' GPU type ({', '.join(gpu_names())}): FP8 scale formats and the memory "
        "check are decided for it, never for this machine's GPU (sets slurm.gpu)",
    )


def gpu_type(text: str) -> str:
    """An argparse type: a GPU type of the closed list (`config.gpus`), by its canonical name;
    an empty name or a near miss is refused, naming the nearest type."""
    from nemo_fp8_rl.config.gpus import find_gpu, unknown_gpu_fix

    gpu = find_gpu(text)
    if gpu is None:
        what = "an empty GPU type" if not text.strip() else f"unknown GPU type {shown(text)!r}"
        raise argparse.ArgumentTypeError(f"{what}; {unknown_gpu_fix(text)}")
    return gpu.name


def gpu_overrides(args: argparse.Namespace) -> list[str]:
    """The override `--gpu` stands for (none without it)."""
    gpu = getattr(args, "gpu", None)
    return [f"slurm.gpu={gpu}"] if gpu else []


def as_user_error(exc: BaseException) -> UserError | None:
    """`exc` as the user error it is; a file the OS refused or could not decode as one; None
    for anything else, which is a bug in this project. Every failure a user can cause is a
    `UserError` (a Ray worker's reaches the driver as Ray's `RayTaskError` subclassing it)."""
    cause = getattr(exc, "cause", None)  # Ray's RayTaskError holds the worker's own exception
    if isinstance(cause, UserError):
        return cause
    if isinstance(exc, UserError):
        return exc
    if isinstance(exc, UnicodeDecodeError):
        return UserError("input", f"not a text file ({exc.reason})", "pass a UTF-8 text file")
    if isinstance(exc, OSError):
        return UserError(
            str(exc.filename or "file system"),
            exc.strerror or str(exc),
            "check the path, its permissions and free space",
        )
    return None


def stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a capture without a descriptor
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def invoke(main: Main, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run `main(argv)` and return its exit code; every failure becomes one `error:` line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("NEMO_FP8_RL_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    prog = prog or getattr(main, "__module__", "nemo_fp8_rl").replace(".cli.", ".")
    previous = _term_interrupts()
    try:
        return main(argv)
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else USAGE)
    except KeyboardInterrupt:
        stopped = UserError(prog, "interrupted", "run it again (with --resume to continue a run)")
        print(f"error: {stopped}", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if stdout_closed():  # `| head` read what it wanted: not a failure to report
            _quiet_stdout()
            return PIPE_CLOSED
        return _report(exc, prog, debug)
    except Exception as exc:  # noqa: BLE001 (the one place every failure is reported)
        return _report(exc, prog, debug)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _term_interrupts() -> Any:
    """Make SIGTERM (`kill`, a scheduler) end the command as Ctrl-C does, so that its clean-up
    (temporary files and folders, locks) runs on both; returns the previous handler (None off
    the main thread or where a command set its own, which is kept)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return None

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _report(exc: Exception, prog: str, debug: bool) -> int:
    """Print the error line of `exc` (a known failure, else an internal error); its exit code."""
    known = as_user_error(exc)
    if debug:
        traceback.print_exc()
    if known is not None:
        print(f"error: {known}", file=sys.stderr)
        return known.code
    bug = UserError(
        prog,
        f"internal error ({type(exc).__name__}: {exc}). This is a bug in nemo-fp8-rl, not a "
        "problem with your input",
        f"please report it on {report_to()} with the command line, its output with --debug and "
        "what `nemo_fp8_rl.env` prints",
    )
    print(f"error: {bug}", file=sys.stderr)
    return RUNTIME


def run_main(main: Main) -> Callable[[], None]:
    """Console-script wrapper: `sys.exit(invoke(main))`."""

    def entry() -> None:
        sys.exit(invoke(main))

    return entry
