"""The one error vocabulary: `Problem` (a key, what is wrong, how to fix it), its renderer, and
`UserError`, the failure the user caused and can fix.

Every command ends such a failure as `error: <where>: <what>. Fix: <how>` with exit code 2 (bad
usage or configuration, found before anything ran), 1 (a runtime fault: a file that cannot be
read, a checkpoint that fails verification) or 3 (the NeMo RL engine is not usable here).
`nemo_fp8_rl.cli.common.invoke` prints it and decides by `isinstance(exc, UserError)` alone: any
other exception is a bug in this project and is reported as one. `ProblemsError` carries several
problems found at once. Both pickle with their fields (Ray sends a worker's exception to the
driver), so a user error raised in a Ray worker stays one. `render` is the only place the
`. Fix: ` text is assembled; `nemo_fp8_rl.cli.usage.EXIT_CODES` lists every code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

USAGE = 2
RUNTIME = 1
UNAVAILABLE = 3
SHOWN = 12  # problems listed in one message; the rest are counted


def render(
    where: str, what: str, fix: str, items: Sequence[object] = (), limit: int | None = SHOWN
) -> str:
    """`<where>: <what>. Fix: <fix>`; with `items`, `<where>: <what>:` then one `  - item` line
    each (at most `limit`, the rest counted) and `Fix: <fix>` on its own line (none when `fix`
    is empty: each item then carries its own). `where` may be empty (the text starts with
    `what`)."""
    head = f"{where}: {what}" if where else what
    if not items:
        return f"{head}. Fix: {fix}"
    kept = list(items)[:limit] if limit is not None else list(items)
    lines = [f"  - {item}" for item in kept]
    if len(items) > len(kept):
        lines.append(f"  ... and {len(items) - len(kept)} more")
    return "\n".join([f"{head}:", *lines, *([f"Fix: {fix}"] if fix else [])])


@dataclass(frozen=True)
class Problem:
    """One problem: the key (dotted path, argument or file) it is about, what is wrong, how to fix
    it; optionally the file (and line) that set or decides it and the rule that found it."""

    key: str
    what: str
    fix: str
    file: str | None = None
    line: int | None = None
    rule: str | None = None

    @property
    def where(self) -> str:
        """`<file>[:<line>]: <key>` (the key alone without a file)."""
        if not self.file:
            return self.key
        at = f"{self.file}:{self.line}" if self.line else self.file
        return f"{at}: {self.key}" if self.key else at

    def render(self) -> str:
        """`<file>[:<line>]: <key>: <what> [<rule>]. Fix: <fix>`."""
        rule = f" [{self.rule}]" if self.rule else ""
        return render(self.where, f"{self.what}{rule}", self.fix)

    def __str__(self) -> str:
        return self.render()


def _rebuild(cls: type[UserError], args: tuple[Any, ...], state: dict[str, Any]) -> UserError:
    """A pickled `UserError` back, without calling its `__init__` (whose arguments differ by
    class)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class UserError(Exception):
    """Where (file, key or argument), what is wrong, and how to fix it; `code` is the exit code."""

    code = RUNTIME

    def __init__(self, where: str, what: str, fix: str, code: int | None = None) -> None:
        self.where, self.what, self.fix = str(where), what.rstrip("."), fix.rstrip(".")
        if code is not None:
            self.code = code
        super().__init__(f"{render(self.where, self.what, self.fix)}.")

    @property
    def problem(self) -> Problem:
        """The error as one `Problem`."""
        return Problem(self.where, self.what, self.fix)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its fields (Ray sends a worker's exception to the driver)."""
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class UsageError(UserError):
    """A bad argument or configuration value (exit code 2)."""

    code = USAGE


class CheckpointError(UserError):
    """A checkpoint cannot be used: none to resume from or to evaluate, or one that fails
    verification; the message says which, why and what to do (exit code 1, or 2 for a choice
    the user made on the command line)."""


class ProblemsError(UserError):
    """Several problems found at once: `<where>: <what>:`, one line per problem, then the fix.

    `problems` are `Problem`s or lines already naming their key (a tensor, a layer); at most
    `limit` are listed, the rest counted."""

    limit: int | None = SHOWN

    def __init__(
        self,
        where: str,
        what: str,
        problems: Sequence[Problem | str],
        fix: str,
        code: int | None = None,
    ) -> None:
        self.where, self.what, self.fix = str(where), what.rstrip("."), fix.rstrip(".")
        self.problems = list(problems)
        if code is not None:
            self.code = code
        text = render(self.where, self.what, self.fix, self.problems, self.limit)
        Exception.__init__(self, text if self.problems else f"{text}.")


def shown(text: str, limit: int = 80) -> str:
    """User text as an error names it: cut to `limit` characters, with its full length (a
    5,000-digit argument would otherwise fill the screen)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"
