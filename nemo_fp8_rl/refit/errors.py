"""The refit's errors: `RefitError`, a streamed refit that failed verification, and
`RefitMismatch`, a refit whose tensors or metadata do not fit the model that receives them. Both
are user errors that list every offending tensor and pickle with their fields (a generation
worker's error crosses Ray to the driver)."""

from __future__ import annotations

from collections.abc import Sequence

from nemo_fp8_rl.config.user_error import ProblemsError


class RefitError(ProblemsError, RuntimeError):
    """A refit failed verification; the receiver kept its previous weights.

    `problems` holds one line per defect (what is wrong and where), `names` the tensors involved.
    """

    limit = 50

    def __init__(self, problems: Sequence[str], names: Sequence[str]) -> None:
        self.names = sorted(set(names))
        super().__init__(
            "refit",
            f"rejected, previous weights kept ({len(problems)} problem(s))",
            problems,
            "build the sender's and the receiver's models from the same recipe, and check the "
            "trainer's weights are finite",
        )


class RefitMismatch(ProblemsError, ValueError):
    """The refit's tensors or metadata do not match the model that receives them (vLLM's, or the
    CPU generation worker's); nothing was loaded. `where` names the receiving call, `what` the
    mismatch, `problems` one line per tensor, `fix` what to change."""

    def __init__(self, where: str, what: str, problems: Sequence[str], fix: str) -> None:
        what = f"{what} ({len(problems)} problem(s)); no weight was loaded"
        super().__init__(where, what, problems, fix)
