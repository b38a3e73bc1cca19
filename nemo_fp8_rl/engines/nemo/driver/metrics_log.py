"""NeMo RL's logger, also writing the run directory's `metrics.jsonl`.

NeMo RL logs through `Logger.log_metrics(metrics, step, prefix)` to TensorBoard / W&B /
MLflow with names `<prefix>/<key>` (`train/loss`, `timing/train/policy_training`, ...). The
project's run directory keeps the same names in `metrics.jsonl` (one JSON object per call:
`{"step": k, "<prefix>/<key>": value, ...}`; several lines may share a step), so `compare`
and `report` read a NeMo RL run like an embedded one. Only numeric scalars go to the file;
everything still goes to NeMo RL's own backends unchanged. Each step's `train/*` line also
carries the machine's 1-minute load average (`system/load_average_1min`, as the embedded engine
records it), so a step's time can be read against the load it ran under.
"""

from __future__ import annotations

import json
import numbers
import os
import time
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import open_append

LOAD_AVERAGE = "system/load_average_1min"


def _scalar(value: Any) -> float | None:
    """A plain float for numbers, 0-d/1-element arrays and tensors; None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    size = getattr(value, "size", None)
    numel = value.numel() if hasattr(value, "numel") else size
    if numel == 1 and hasattr(value, "item"):
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) else None
    return None


def flatten_metrics(metrics: dict[str, Any], prefix: str | None) -> dict[str, float]:
    """`{prefix/key: float}` for the numeric scalars in `metrics` (nested dicts joined by `/`)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten_metrics(value, name))
            continue
        number = _scalar(value)
        if number is not None:
            out[name] = number
    return out


def health_monitor(config: dict[str, Any], path: Path) -> Any:
    """A `guards.health.HealthMonitor` for the recipe's precision, caught up on the steps a
    resumed run already wrote to `path` (so a resume neither repeats nor loses an event)."""
    from nemo_fp8_rl.guards.breach import health_table
    from nemo_fp8_rl.guards.health import HealthMonitor, precision_of

    monitor = HealthMonitor(precision_of(config), health_table(config), engine="nemo")
    if path.is_file():
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        monitor.replay(r for r in records if isinstance(r, dict))
    return monitor


class BreachStop:
    """`health.on_breach: stop` on NeMo RL's loop (`guards.breach`). NeMo RL logs a step's
    `train/*` metrics after its checkpoint decision, so the stop comes at the first `train` log,
    at or after the breach, of a step NeMo RL saved a checkpoint for (`checkpointing.
    save_period` bounds the wait); `seen` then raises the located error."""

    def __init__(self, config: dict[str, Any], run: str, resume: str) -> None:
        self.config, self.run, self.resume = config, run, resume
        self.checkpoints = Path(config["checkpointing"]["checkpoint_dir"])
        self.pending: Any = None
        self.since = 0.0

    def seen(self, step: int, prefix: str | None, events: list[Any]) -> None:
        """Note a breach; raise `HealthBreach` once a checkpoint at or after it exists."""
        from nemo_fp8_rl.engines.nemo.driver.worker_faults import latest_checkpoint
        from nemo_fp8_rl.guards.breach import breach_error

        if events and self.pending is None:
            self.pending, self.since = events[0], time.perf_counter()
        if self.pending is None or prefix != "train":
            return
        kept = latest_checkpoint(self.checkpoints)
        if kept is not None and int(kept.name[5:]) >= step >= self.pending.step:
            seconds = time.perf_counter() - self.since
            raise breach_error(self.pending, self.config, self.run, str(kept), self.resume, seconds)


class MetricsTee:
    """Wraps NeMo RL's `Logger`: every `log_metrics` call also appends a line to `path`; with a
    `monitor` (`guards.health.HealthMonitor`) each health event is printed and recorded too,
    and with `stop` (`BreachStop`) a breach ends the run once it is checkpointed."""

    def __init__(
        self, logger: Any, path: Path, monitor: Any = None, stop: BreachStop | None = None
    ) -> None:
        self._logger = logger
        self.path = path
        self._monitor = monitor
        self._stop = stop
        path.parent.mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._logger, name)

    def log_metrics(
        self, metrics: dict[str, Any], step: int, prefix: str | None = "", *args: Any, **kwargs: Any
    ) -> None:
        """NeMo RL's `log_metrics`, then the numeric scalars as one JSON line."""
        self._logger.log_metrics(metrics, step, prefix, *args, **kwargs)
        row = flatten_metrics(metrics, prefix)
        if not row:
            return
        if prefix == "train":
            row[LOAD_AVERAGE] = os.getloadavg()[0]
        events = [] if self._monitor is None else self._monitor.observe(int(step), row)
        with open_append(self.path) as fh:  # never through a link in the run dir
            fh.write(json.dumps({"step": int(step), **row}) + "\n")
            for event in events:
                fh.write(json.dumps(event.record()) + "\n")
        for event in events:
            print(event.line(), flush=True)
        if self._stop is not None:
            self._stop.seen(int(step), prefix, events)
