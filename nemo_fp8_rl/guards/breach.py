"""What a run does on a health breach (`health.on_breach`), on both engines.

`warn` (the default) prints the health line and records the event (`guards.health`). `stop`
saves a checkpoint and ends the run with `HealthBreach`: the metric, its robust statistic and
value, the healthy range and its source, the checkpoint, the command that resumes, and the
overrides that address a mismatch the recipe allows: importance-sampling correction when it is
off, FP8 only in the rollout when the trainer runs FP8 too, and the BF16 recipe.

`health.limits` replaces a metric's published median limit for the recipe (a stricter range
for a sensitive study, or a range set below the healthy value to rehearse a stop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from nemo_fp8_rl.config.user_error import RUNTIME, UserError
from nemo_fp8_rl.guards.health import HealthEvent, HealthTable, load_table

LIMITS_SOURCE = "this recipe's health.limits"


class HealthBreach(UserError):
    """A run stopped by `health.on_breach: stop` (exit code 1); `event` is the breach."""

    code = RUNTIME

    def __init__(
        self,
        where: str,
        what: str,
        fix: str,
        event: HealthEvent | None = None,
        seconds: float | None = None,
    ) -> None:
        super().__init__(where, what, fix)
        self.event, self.seconds = event, seconds  # seconds: from the breach to the stop


def on_breach(config: Mapping[str, Any]) -> str:
    """`warn` or `stop` (`health.on_breach`; `warn` where the recipe has no health section)."""
    return str((config.get("health") or {}).get("on_breach", "warn"))


def health_table(config: Mapping[str, Any]) -> HealthTable:
    """The committed table with the recipe's `health.limits` replacing median limits."""
    table = load_table()
    limits = (config.get("health") or {}).get("limits") or {}
    if not limits:
        return table
    rules = {
        precision: [
            dataclasses.replace(r, limit=float(limits[r.metric]), source=LIMITS_SOURCE)
            if r.statistic == "median" and r.metric in limits
            else r
            for r in rules
        ]
        for precision, rules in table.rules.items()
    }
    return dataclasses.replace(table, rules=rules)


def helpful_overrides(config: Mapping[str, Any]) -> list[str]:
    """Overrides that address a train/rollout mismatch this recipe allows (module docstring)."""
    policy = config.get("policy") or {}
    vllm = ((policy.get("generation") or {}).get("vllm_cfg")) or {}
    fp8 = (policy.get("megatron_cfg") or {}).get("fp8_cfg") or {}
    loss = config.get("loss_fn") or {}
    out = []
    if vllm.get("precision") == "fp8" and not loss.get("use_importance_sampling_correction"):
        out.append(
            "importance-sampling correction: loss_fn.use_importance_sampling_correction=true"
        )
    if vllm.get("precision") == "fp8" and fp8.get("enabled"):
        out.append("FP8 only in the rollout: policy.megatron_cfg.fp8_cfg.enabled=false")
    if (
        vllm.get("precision") == "fp8"
        or fp8.get("enabled")
        or (config.get("local") or {}).get("fp4")
    ):
        out.append("BF16: the recipe's -bf16 sibling")
    return out


def breach_error(
    event: HealthEvent,
    config: Mapping[str, Any],
    run: str,
    checkpoint: str | None,
    resume: str,
    seconds: float | None = None,
) -> HealthBreach:
    """The located error `stop` ends the run with (module docstring)."""
    rule = event.rule
    what = (
        f"stopped by health.on_breach: stop: {rule.metric} {rule.statistic.replace('_', ' ')} "
        f"{event.value:.4g} outside the healthy range for {event.precision} "
        f"({rule.describe()}; source: {rule.source}) for {event.consecutive} steps in a row"
    )
    saved = (
        f"the checkpoint {checkpoint} holds step {event.step}"
        if checkpoint
        else "no checkpoint was saved"
    )
    helps = helpful_overrides(config)
    tried = f"; or start a new run with what may help ({'; '.join(helps)})" if helps else ""
    fix = f"{saved}; to go on past the breach, resume with: {resume} health.on_breach=warn{tried}"
    return HealthBreach(f"{run} (step {event.step})", what, fix, event, seconds)
