"""Run health: the train/generation mismatch against its healthy range, per step, both engines.

The table is `health_ranges.yaml` (each threshold with its source). At every step the monitor
takes each rule's robust statistic over the trailing window (`median`, or `share_above` a
level) of the steps that logged the metric; a statistic outside its range for K consecutive
steps is one event: a line naming the metric, its value, the range, its source and the likely
causes, and a record in `metrics.jsonl`:

    {"step": 12, "event": {"kind": "health", "metric": "train/token_mult_prob_error", ...}}

(`event` is a nested object, so readers that take a line's numbers as metrics skip it). The
monitor re-arms once the statistic is back inside; the steps from the first outside to the last
outside are one `Episode`. The causes listed are those of the engine that ran (`engines` in the
table: the embedded engine has no vLLM and no NeMo RL FP8 patches).

`run_health` judges a whole run for `compare` and the end-of-run summary: its verdict is the
statistics it prints, each rule's statistic over all the run's steps against its limit
(UNHEALTHY only when one is outside); a window that left the range and came back is listed as
a transient episode with its steps, not taken for the run's verdict.
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


ENGINES = ("nemo", "local")


@dataclass(frozen=True)
class HealthTable:
    rules: dict[str, list[Rule]]  # precision -> rules
    consecutive: int
    causes: dict[str, list[tuple[str, tuple[str, ...]]]]  # metric -> (cause, its engines)
    control: dict[str, Any]

    def causes_for(self, metric: str, engine: str | None) -> list[str]:
        """The causes of `metric` that can apply on `engine` (all of them when it is unknown)."""
        return [
            c
            for c, engines in self.causes.get(metric, [])
            if engine not in ENGINES or engine in engines
        ]


def _causes(raw: dict[str, list[Any]]) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """The table's causes: `{cause, engines}` entries (a bare string applies to every engine)."""
    return {
        metric: [
            (e, ENGINES) if isinstance(e, str) else (e["cause"], tuple(e["engines"]))
            for e in entries
        ]
        for metric, entries in raw.items()
    }


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
    return HealthTable(rules, int(raw["consecutive"]), _causes(raw["causes"]), raw["control"])


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


def _short(rule: Rule) -> str:
    """`gen_kl_error median`, `token_mult_prob_error share >1.1`: a rule in a summary line."""
    stat = "median" if rule.statistic == "median" else f"share >{rule.level:g}"
    return f"{rule.metric.removeprefix('train/')} {stat}"


@dataclass
class Episode:
    """Steps at which one rule's trailing statistic stayed outside its range (K or more in a
    row): `first` to `last`, the worst value, and the step it came back (`back`)."""

    rule: Rule
    first: int
    last: int
    worst: float
    back: int | None = None  # the step the statistic was back inside (None: still outside)

    def text(self) -> str:
        end = (
            "still outside at the last step"
            if self.back is None
            else f"back in range at step {self.back}"
        )
        return (
            f"{_short(self.rule)} over {self.rule.window} steps outside < {self.rule.limit:g} at steps "
            f"{self.first}-{self.last} (worst {self.worst:.4g}; {end})"
        )


@dataclass
class HealthMonitor:
    """Watches one run's metrics step by step (module docstring); `engine` picks the causes."""

    precision: str
    table: HealthTable = field(default_factory=load_table)
    history: dict[str, list[float]] = field(default_factory=dict)
    streak: dict[tuple[str, str], int] = field(default_factory=dict)
    engine: str | None = None
    episodes: list[Episode] = field(default_factory=list)
    _open: dict[tuple[str, str], Episode] = field(default_factory=dict)

    def _record(self, metrics: Mapping[str, Any]) -> set[str]:
        """Append this step's values to the history; the metrics it logged."""
        seen = set()
        for name in {r.metric for r in self.table.rules[self.precision]}:
            value = metrics.get(name, "")
            if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
                self.history.setdefault(name, []).append(
                    math.nan if value is None else float(value)
                )
                seen.add(name)  # None: logged as null, i.e. not finite
        return seen

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[HealthEvent]:
        """Feed one step's metrics; returns the events this step completes (K-th outside)."""
        seen = self._record(metrics)
        events = []
        for rule in self.table.rules[self.precision]:
            values = self.history.get(rule.metric, [])
            needed = min(rule.window, 3) if rule.statistic == "median" else rule.window
            if rule.metric not in seen or rule.limit is None or len(values) < needed:
                continue
            key = (rule.metric, rule.statistic)
            value = rule.value(values[-rule.window :])
            self.streak[key] = self.streak.get(key, 0) + 1 if rule.outside(value) else 0
            self._track(key, rule, step, value)
            if self.streak[key] == self.table.consecutive:
                causes = self.table.causes_for(rule.metric, self.engine)
                events.append(
                    HealthEvent(step, rule, value, self.precision, causes, self.streak[key])
                )
        return events

    def _track(self, key: tuple[str, str], rule: Rule, step: int, value: float) -> None:
        """Open an episode at the K-th step outside, extend it, close it on the way back."""
        streak, episode = self.streak[key], self._open.get(key)
        if streak == 0 and episode is not None:
            episode.back = step
            del self._open[key]
        elif streak == self.table.consecutive:
            first = step - streak + 1
            self._open[key] = Episode(rule, first, step, value)
            self.episodes.append(self._open[key])
        elif episode is not None:
            episode.last, episode.worst = step, max(episode.worst, value)

    def replay(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Catch up on a resumed run's earlier steps without reporting them again."""
        for record in records:
            if "event" not in record and isinstance(record.get("step"), int):
                self.observe(int(record["step"]), record)


@dataclass
class RunHealth:
    """A whole run against the table: each rule's statistic over the run (the verdict), and the
    episodes its trailing windows spent outside (reported with their steps, not the verdict)."""

    precision: str
    stats: list[tuple[Rule, float | None]]
    episodes: list[Episode]
    engine: str | None = None

    @property
    def outside(self) -> list[tuple[Rule, float]]:
        """The judged statistics outside their range (what makes the run UNHEALTHY)."""
        return [(r, v) for r, v in self.stats if v is not None and r.outside(v)]

    @property
    def healthy(self) -> bool:
        return not self.outside

    def line(self) -> str:
        """`health (<precision>): healthy|UNHEALTHY: <each statistic, OK or OUT>`, then the
        transient episodes and, when unhealthy, the causes for this engine."""
        judged = [(r, v) for r, v in self.stats if v is not None and r.limit is not None]
        shown = "; ".join(
            f"{_short(r)} {v:.4g} ({'OK' if not r.outside(v) else 'OUT'} < {r.limit:g})"
            for r, v in judged
        )
        verdict = (
            "healthy"
            if self.healthy
            else f"UNHEALTHY ({len(self.outside)} statistic(s) out of range)"
        )
        text = f"health ({self.precision}, over all steps): {verdict}" + (
            f": {shown}" if shown else ": no mismatch metric logged"
        )
        if self.episodes:
            word = "window" if len(self.episodes) == 1 else "windows"
            text += f"; {len(self.episodes)} {word} outside: " + "; ".join(
                e.text() for e in self.episodes
            )
        causes = [
            c for r, _ in self.outside for c in load_table().causes_for(r.metric, self.engine)
        ]
        if causes:
            text += "; likely causes: " + "; ".join(dict.fromkeys(causes))
        return text


def _steps(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if "event" not in r]


def run_health(
    records: list[Mapping[str, Any]], precision: str, engine: str | None = None
) -> RunHealth:
    """Judge a run from its `metrics.jsonl` records (module docstring); `engine` ("local" or
    "nemo", from `environment.json`) filters the causes."""
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
    monitor = HealthMonitor(precision, table, engine=engine)
    monitor.replay(
        sorted(
            _steps(records), key=lambda r: r.get("step", 0) if isinstance(r.get("step"), int) else 0
        )
    )
    return RunHealth(precision, stats, monitor.episodes, engine)


def median_of(records: list[Mapping[str, Any]], metric: str) -> float | None:
    """The run's median of `metric` (None when never logged): a BF16 control's floor."""
    values = [float(r[metric]) for r in _steps(records) if isinstance(r.get(metric), int | float)]
    return float(statistics.median(values)) if values else None
