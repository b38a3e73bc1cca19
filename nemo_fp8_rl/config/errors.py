"""Config problems, reported all at once with key path, the file that set the key, and a fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a resolved recipe: where (key path, file), what is wrong, how to fix it."""

    key: str
    problem: str
    fix: str
    source: str = "?"

    def __str__(self) -> str:
        return f"{self.source}: {self.key}: {self.problem}. Fix: {self.fix}"


class RecipeError(ValueError):
    """Raised when a recipe cannot be loaded or fails validation; lists every problem found."""

    def __init__(self, recipe: str, issues: list[ConfigIssue]):
        self.recipe = recipe
        self.issues = list(issues)
        lines = [f"recipe {recipe} has {len(issues)} problem(s):"]
        lines += [f"  - {issue}" for issue in issues]
        super().__init__("\n".join(lines))
