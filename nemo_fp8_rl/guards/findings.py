"""What a guard check reports: findings (located errors or warnings) and a verdict per check.

Every finding names the rule it comes from, the upstream issue the rule encodes, the NeMo RL
versions it applies to (so it can be retired once upstream fixes the cause), where in the recipe
(dotted key, and the file that set it), what is wrong and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_fp8_rl.config.user_error import Problem

ERROR, WARNING = "error", "warning"
PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass(frozen=True)
class Finding:
    """One problem a rule found in a recipe."""

    rule: str  # e.g. "fp8-active/executor"
    severity: str  # ERROR (refused before launch) or WARNING (outcome uncertain)
    key: str  # dotted key path in the recipe
    what: str
    fix: str
    upstream: str  # the upstream issue or PR the rule encodes
    applies_to: str = ""  # NeMo RL versions the rule applies to
    source: str = "?"  # the file (or "override") that set `key`

    def problem(self, versions: bool = True, source: bool = True) -> Problem:
        """The finding as a `Problem`: its rule is `rule, upstream[; versions]`."""
        applies = f"; {self.applies_to}" if versions and self.applies_to else ""
        rule = f"{self.rule}, {self.upstream}{applies}"
        return Problem(self.key, self.what, self.fix, self.source if source else None, rule=rule)

    def line(self) -> str:
        """`<severity>: <source>: <key>: <what> [rule, upstream; versions]. Fix: <fix>`."""
        return f"{self.severity}: {self.problem().render()}"


@dataclass
class CheckResult:
    """The verdict of one check on one recipe: pass, warn, fail or skip (with why)."""

    check: str
    note: str = ""
    findings: list[Finding] = field(default_factory=list)
    skipped: bool = False

    @property
    def verdict(self) -> str:
        if self.skipped:
            return SKIP
        if any(f.severity == ERROR for f in self.findings):
            return FAIL
        return WARN if self.findings else PASS

    def lines(self) -> list[str]:
        head = f"  {self.verdict:<4}  {self.check}" + (f": {self.note}" if self.note else "")
        return [head] + [f"        {f.line()}" for f in self.findings]


@dataclass
class GuardReport:
    """The checks run on one recipe, in catalogue order."""

    recipe: str
    results: list[CheckResult] = field(default_factory=list)
    not_run: str = ""  # the GPU-specific checks that could not run, and how to run them

    @property
    def errors(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def result(self, check: str) -> CheckResult:
        return next(r for r in self.results if r.check == check)

    def render(self) -> str:
        lines = [f"guard rails for {self.recipe} (docs/guard-rails.md):"]
        for res in self.results:
            lines += res.lines()
        if self.not_run:
            lines.append(f"  {self.not_run}")
        return "\n".join(lines)


def source_of(provenance: dict[str, str], key: str) -> str:
    """The file that set `key` (or its nearest parent), "default" when none did."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        found = provenance.get(".".join(parts[:i]))
        if found:
            return found
    return "default"
