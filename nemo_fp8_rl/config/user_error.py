"""`UserError`: a failure the user caused and can fix, reported as one located line.

Every command ends such a failure as `error: <where>: <what>. Fix: <how>` with exit code 2 (bad
usage or configuration, found before anything ran), 1 (a runtime fault: a file that cannot be
read, a checkpoint that fails verification) or 3 (the NeMo RL engine is not usable here).
`nemo_fp8_rl.cli.common.invoke` prints it; `nemo_fp8_rl.cli.usage.EXIT_CODES` lists every code.
"""

from __future__ import annotations

USAGE = 2
RUNTIME = 1
UNAVAILABLE = 3


class UserError(Exception):
    """Where (file, key or argument), what is wrong, and how to fix it; `code` is the exit code."""

    code = RUNTIME

    def __init__(self, where: str, what: str, fix: str, code: int | None = None) -> None:
        self.where, self.what, self.fix = str(where), what.rstrip("."), fix.rstrip(".")
        if code is not None:
            self.code = code
        super().__init__(f"{self.where}: {self.what}. Fix: {self.fix}.")


class UsageError(UserError):
    """A bad argument or configuration value (exit code 2)."""

    code = USAGE


def shown(text: str, limit: int = 80) -> str:
    """User text as an error names it: cut to `limit` characters, with its full length (a
    5,000-digit argument would otherwise fill the screen)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"
