"""Config problems, reported all at once with key path, the file that set the key, and a fix."""

from __future__ import annotations

from collections.abc import Sequence

from nemo_fp8_rl.config.user_error import USAGE, Problem, ProblemsError

__all__ = [
    "Problem",
    "RecipeError",
]  # a recipe's problem: key path, what, fix, the file that set it


class RecipeError(ProblemsError, ValueError):
    """Raised when a recipe cannot be loaded or fails validation; lists the first `limit` problems
    (`recipe <name> has N problem(s):` and one line each, every line with its own fix)."""

    code = USAGE
    limit = 50  # listed; the rest counted ("... and M more"): 100,000 misspelt keys are one screen

    def __init__(self, recipe: str, issues: Sequence[Problem]) -> None:
        self.recipe = recipe
        self.issues = list(issues)
        super().__init__("", f"recipe {recipe} has {len(self.issues)} problem(s)", self.issues, "")
