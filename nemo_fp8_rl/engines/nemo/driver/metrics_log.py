"""NeMo RL's logger, also writing the run directory's `metrics.jsonl`.

NeMo RL logs through `Logger.log_metrics(metrics, step, prefix)` to TensorBoard / W&B /
MLflow with names `<prefix>/<key>` (`train/loss`, `timing/train/policy_training`, ...). The
project's run directory keeps the same names in `metrics.jsonl`, one JSON object per completed
step (`{"step": k, "<prefix>/<key>": value, ...}`, the step's calls merged, a later call's value
winning), as the embedded engine writes it, so `compare` and `report` read a NeMo RL run like an
embedded one. Only numeric scalars go to the file; everything still goes to NeMo RL's own
backends unchanged, at once. A step with `train/*` metrics also carries the machine's 1-minute
load average (`system/load_average_1min`, as the embedded engine records it), so a step's time
can be read against the load it ran under.

A step's row is written when NeMo RL says the step is finished (`step_finished=True`, its last
call of a step, in `grpo_train` and `async_grpo_train` of both pinned versions), when a later
step's first call comes (step 0's validation and set-up timings have no finishing call), or by
`finish()` once the loop returned. NeMo RL logs a step's rollout metrics as `train/*` before the
step trains; a run killed inside the step therefore leaves no row of it, where a row per call
would leave that partial row, and a resume (which trains the step again) would add a second
one. A resumed run first drops the rows after its checkpoint's step
(`runs.resume.keep_completed_rows`): those steps are trained again.
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
    """`health.on_breach: stop` on NeMo RL's loop (`guards.breach`). A step's row is complete
    after NeMo RL's checkpoint decision for it, so the stop comes at the first completed step,
    at or after the breach, that NeMo RL saved a checkpoint for (`checkpointing.save_period`
    bounds the wait); `seen` then raises the located error."""

    def __init__(self, config: dict[str, Any], run: str, resume: str) -> None:
        self.config, self.run, self.resume = config, run, resume
        self.checkpoints = Path(config["checkpointing"]["checkpoint_dir"])
        self.pending: Any = None
        self.since = 0.0

    def seen(self, step: int, events: list[Any]) -> None:
        """Note a breach; raise `HealthBreach` once a checkpoint at or after it exists."""
        from nemo_fp8_rl.engines.nemo.driver.worker_faults import latest_checkpoint
        from nemo_fp8_rl.guards.breach import breach_error

        if events and self.pending is None:
            self.pending, self.since = events[0], time.perf_counter()
        if self.pending is None:
            return
        kept = latest_checkpoint(self.checkpoints)
        if kept is not None and int(kept.name[5:]) >= step >= self.pending.step:
            seconds = time.perf_counter() - self.since
            raise breach_error(self.pending, self.config, self.run, str(kept), self.resume, seconds)


class MetricsTee:
    """Wraps NeMo RL's `Logger`: every `log_metrics` call goes to it at once and into the
    current step's row of `path`, written when the step completes (module docstring); with a
    `monitor` (`guards.health.HealthMonitor`) each health event is printed and recorded after
    its step's row, and with `stop` (`BreachStop`) a breach ends the run once checkpointed."""

    def __init__(
        self, logger: Any, path: Path, monitor: Any = None, stop: BreachStop | None = None
    ) -> None:
        self._logger = logger
        self.path = path
        self._monitor = monitor
        self._stop = stop
        self._step: int | None = None
        self._row: dict[str, float] = {}
        path.parent.mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._logger, name)

    def log_metrics(
        self, metrics: dict[str, Any], step: int, prefix: str | None = "", *args: Any, **kwargs: Any
    ) -> None:
        """NeMo RL's `log_metrics`, then the numeric scalars into the step's row; the row is
        written when this call finishes the step (`step_finished`)."""
        self._logger.log_metrics(metrics, step, prefix, *args, **kwargs)
        finished = bool(kwargs.get("step_finished") or (len(args) > 1 and args[1]))
        if self._step is not None and int(step) != self._step:
            self.finish()  # a new step began: the previous one is complete
        self._step = int(step)
        self._row.update(flatten_metrics(metrics, prefix))
        if finished:
            self.finish()

    def finish(self) -> None:
        """Write the pending step's row (and its health events); nothing when none is pending."""
        step, row = self._step, self._row
        self._step, self._row = None, {}
        if step is None or not row:
            return
        if any(name.startswith("train/") for name in row):
            row[LOAD_AVERAGE] = os.getloadavg()[0]
        events = [] if self._monitor is None else self._monitor.observe(step, row)
        with open_append(self.path) as fh:  # never through a link in the run dir
            fh.write(json.dumps({"step": step, **row}) + "\n")
            for event in events:
                fh.write(json.dumps(event.record()) + "\n")
        for event in events:
            print(event.line(), flush=True)
        if self._stop is not None:
            self._stop.seen(step, events)
