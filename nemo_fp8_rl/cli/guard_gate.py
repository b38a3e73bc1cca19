"""The pre-launch guard rails alone, as `submit` (real and dry run) and `train --dry-run` ask
them where NeMo RL is not importable (a login node): the checks that need only the recipe and
the model's `config.json` run, those that read NeMo RL's source say they did not run and how
to run them (docs/guard-rails.md)."""

from __future__ import annotations

import sys

from nemo_fp8_rl.config.user_error import UsageError


def guard_gate(recipe, refused: str, skip_hint: str) -> None:
    """Print the guard report on stderr; refuse (exit 2) when it holds an error. `refused`
    begins the error ("not submitted"), `skip_hint` says how to go on without the checks."""
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import pre_launch_report

    report = pre_launch_report(recipe)
    print(report.render(), file=sys.stderr)
    if not report.ok:
        raise UsageError(
            recipe.name,
            f"{refused}: the guard rails found {len(report.errors)} problem(s), listed above",
            f"fix each in the recipe (or with an override){skip_hint}",
        )
