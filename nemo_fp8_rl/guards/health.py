"""Run health: the train/generation mismatch against its healthy range, per step, both engines.

The table is `health_ranges.yaml` (each threshold with its source). At every step the monitor
takes each rule's robust statistic over the trailing window (`median`, or `share_above` a
level) of the steps that logged the metric; a statistic outside its range for K consecutive
steps is one event: a line naming the metric, its value, the range, its source and the likely
causes, and a record in `metrics.jsonl`:

    {"step": 12, "event": {"kind": "health", "metric": "train/token_mult_prob_error", ...}}

(`event` is a nested object, so readers that take a line's numbers as metrics skip it). The
monitor re-arms once the statistic is back inside. `run_health` judges a whole run the same
way (the statistic over all its steps, and the events it recorded), for `compare` and the
end-of-run summary.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

TABLE = Path(__file__).with_name("health_ranges.yaml")
PRECISIONS = ("bf16", "fp8", "fp8_kv", "mxfp8", "fp4")


@dataclass(frozen=True)
class Rule:
    """One metric's statistic and its limit for one precision (None: not judged)."""

    metric: str
    statistic: str  # "median" | "share_above"
    level: float | None
    limit: float | None
    source: str
    window: int

    def describe(self) -> str:
        stat = "median" if self.statistic == "median" else f"share of steps above {self.level:g}"
        rng = "not published" if self.limit is None else f"< {self.limit:g}"
        return f"{self.metric} {stat} over {self.window} steps {rng}"

    def value(self, values: list[float]) -> float:
        """The statistic of `values` (NaN counts as outside: +inf for a median, above a level)."""
        clean = [math.inf if math.isnan(v) else v for v in values]
        if self.statistic == "median":
            return float(statistics.median(clean))
        return sum(v > (self.level or 0.0) for v in clean) / len(clean)

    def outside(self, value: float) -> bool:
        return self.limit is not None and not value < self.limit


@dataclass(frozen=True)
class HealthTable:
    rules: dict[str, list[Rule]]  # precision -> rules
    consecutive: int
    causes: dict[str, list[str]]
    control: dict[str, Any]


@cache
def load_table(path: Path = TABLE) -> HealthTable:
    """The committed table (`health_ranges.yaml`)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    rules: dict[str, list[Rule]] = {p: [] for p in PRECISIONS}
    for entry in raw["rules"]:
        window = raw["share_window"] if entry["statistic"] == "share_above" else raw["window"]
        for precision in PRECISIONS:
            spec = entry["limits"][precision]
            rules[precision].append(
                Rule(
                    entry["metric"],
                    entry["statistic"],
                    entry.get("level"),
                    spec["limit"],
                    spec["source"],
                    int(window),
                )
            )
    return HealthTable(rules, int(raw["consecutive"]), raw["causes"], raw["control"])


def precision_of(config: Mapping[str, Any]) -> str:
    """The health table's precision class of a resolved recipe."""
    if (config.get("local") or {}).get("fp4"):
        return "fp4"
    policy = config.get("policy") or {}
    vllm = ((policy.get("generation") or {}).get("vllm_cfg")) or {}
    mcore = policy.get("megatron_cfg") or {}
    fp8 = mcore.get("fp8_cfg") or {}
    training = bool(fp8.get("enabled")) and bool(mcore.get("enabled", True))
    rollout = vllm.get("precision") == "fp8"
    if (rollout and vllm.get("is_mx")) or (training and fp8.get("fp8_recipe") == "mxfp8"):
        return "mxfp8"
    if rollout and str(vllm.get("kv_cache_dtype", "auto")).startswith("fp8"):
        return "fp8_kv"
    return "fp8" if rollout or training else "bf16"


@dataclass
class HealthEvent:
    step: int
    rule: Rule
    value: float
    precision: str
    causes: list[str]
    consecutive: int

    def line(self) -> str:
        causes = "; ".join(self.causes) or "see docs/guard-rails.md"
        return (
            f"health: step {self.step}: {self.rule.metric} {self.rule.statistic.replace('_', ' ')} "
            f"{self.value:.4g} outside the healthy range for {self.precision} ({self.rule.describe()}; "
            f"{self.rule.source}) for {self.consecutive} steps; likely causes: {causes}"
        )

    def record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "event": {
                "kind": "health",
                "metric": self.rule.metric,
                "statistic": self.rule.statistic,
                "level": self.rule.level,
                "value": None if math.isinf(self.value) else self.value,
                "limit": self.rule.limit,
                "window": self.rule.window,
                "consecutive": self.consecutive,
                "precision": self.precision,
                "source": self.rule.source,
                "causes": self.causes,
            },
        }


@dataclass
class HealthMonitor:
    """Watches one run's metrics step by step (module docstring)."""

    precision: str
    table: HealthTable = field(default_factory=load_table)
    history: dict[str, list[float]] = field(default_factory=dict)
    streak: dict[tuple[str, str], int] = field(default_factory=dict)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[HealthEvent]:
        """Feed one step's metrics; returns the events this step completes (K-th outside)."""
        seen = set()
        for name in {r.metric for r in self.table.rules[self.precision]}:
            if name not in metrics:
                continue
            value = metrics[name]
            if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
                self.history.setdefault(name, []).append(
                    math.nan if value is None else float(value)
                )
                seen.add(name)  # None: logged as null, i.e. not finite
        events = []
        for rule in self.table.rules[self.precision]:
            values = self.history.get(rule.metric, [])
            needed = min(rule.window, 3) if rule.statistic == "median" else rule.window
            if rule.metric not in seen or rule.limit is None or len(values) < needed:
                continue
            key = (rule.metric, rule.statistic)
            value = rule.value(values[-rule.window :])
            self.streak[key] = self.streak.get(key, 0) + 1 if rule.outside(value) else 0
            if self.streak[key] == self.table.consecutive:
                causes = list(self.table.causes.get(rule.metric, []))
                events.append(
                    HealthEvent(step, rule, value, self.precision, causes, self.streak[key])
                )
        return events

    def replay(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Catch up on a resumed run's earlier steps without reporting them again."""
        for record in records:
            if "event" not in record and isinstance(record.get("step"), int):
                self.observe(int(record["step"]), record)


@dataclass
class RunHealth:
    """A whole run against the table: each rule's statistic over the run, and its events."""

    precision: str
    stats: list[tuple[Rule, float | None]]
    events: list[dict[str, Any]]

    @property
    def healthy(self) -> bool:
        return not self.events and not any(v is not None and r.outside(v) for r, v in self.stats)

    def line(self) -> str:
        judged = [(r, v) for r, v in self.stats if v is not None and r.limit is not None]
        shown = "; ".join(
            f"{r.metric.removeprefix('train/')} {r.statistic.replace('_above', ' >' + format(r.level or 0, 'g'))} "
            f"{v:.4g} ({'OK' if not r.outside(v) else 'OUT'} < {r.limit:g})"
            for r, v in judged
        )
        verdict = "healthy" if self.healthy else f"UNHEALTHY ({len(self.events)} event(s))"
        return f"health ({self.precision}): {verdict}" + (
            f": {shown}" if shown else ": no mismatch metric logged"
        )


def _steps(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if "event" not in r]


def run_health(records: list[Mapping[str, Any]], precision: str) -> RunHealth:
    """Judge a run from its `metrics.jsonl` records (module docstring)."""
    table = load_table()
    stats = []
    for rule in table.rules[precision]:
        values = [
            math.nan if r[rule.metric] is None else float(r[rule.metric])
            for r in _steps(records)
            if rule.metric in r
            and (r[rule.metric] is None or isinstance(r[rule.metric], int | float))
        ]
        stats.append((rule, rule.value(values) if values else None))
    events = [
        r["event"]
        for r in records
        if isinstance(r.get("event"), dict) and r["event"].get("kind") == "health"
    ]
    return RunHealth(precision, stats, events)


def median_of(records: list[Mapping[str, Any]], metric: str) -> float | None:
    """The run's median of `metric` (None when never logged): a BF16 control's floor."""
    values = [float(r[metric]) for r in _steps(records) if isinstance(r.get(metric), int | float)]
    return float(statistics.median(values)) if values else None
