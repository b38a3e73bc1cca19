"""`RefitError`: a refit that was refused, naming every offending tensor."""

from __future__ import annotations


class RefitError(RuntimeError):
    """A refit failed verification; the receiver kept its previous weights.

    `problems` holds one line per defect (what is wrong and where), `names` the tensors involved.
    """

    def __init__(self, problems: list[str], names: list[str]) -> None:
        self.problems = list(problems)
        self.names = sorted(set(names))
        shown = "\n  ".join(self.problems[:50])
        more = f"\n  … and {len(self.problems) - 50} more" if len(self.problems) > 50 else ""
        super().__init__(
            f"refit rejected, previous weights kept ({len(self.problems)} problem(s)):\n  {shown}{more}"
        )
