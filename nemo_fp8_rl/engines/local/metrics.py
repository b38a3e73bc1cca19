"""Per-step metrics: JSONL in the run directory, TensorBoard events, and a progress bar.

Names follow docs/architecture.md (`train/...`, `validation/...`, `timing/train/...`,
`throughput/...`). On resume after k completed steps the JSONL keeps only lines with step <= k and the
TensorBoard writer purges events after step k, so a resumed run's files equal an
uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from nemo_fp8_rl.config.safe_files import open_append
from nemo_fp8_rl.runs.resume import keep_completed_rows

HEADLINE = (
    ("reward", "train/reward", "{:.3f}"),
    ("val", "validation/bf16_accuracy", "{:.3f}"),  # BF16-generation score (runs.scores)
    ("clipL-", "train/clip_lower_frac_neg", "{:.4f}"),
    ("L,H", None, None),
    ("ent", "train/entropy", "{:.3f}"),  # not "H": that is the upper clip bound, in "L,H"
    ("tok/s", "throughput/tokens_per_sec", "{:.0f}"),
)
# What each headline field is, printed once when a run starts (docs/commands.md, "Following a run").
LEGEND = (
    "reward = mean exact-match reward of the step's samples; val = validation accuracy (BF16 "
    "generation of the trained weights) at the last validation; clipL- = share of "
    "negative-advantage (A<0) tokens clipped at the lower bound (their gradient is zero); L,H = "
    "the lower and upper clip bounds of the importance ratio in force (calibrated runs); ent = "
    "mean token entropy; tok/s and s/step = speed of the last step"
)


def _clean(value: float) -> float | None:
    """JSON-safe float (NaN and inf become null)."""
    value = float(value)
    return value if math.isfinite(value) else None


class MetricsLogger:
    """Writes `{"step": k, name: value, ...}` lines to `metrics.jsonl` and TensorBoard scalars."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool,
        completed_steps: int = 0,
        sinks: Sequence[Any] = (),
    ) -> None:
        """Open the run's metric sinks, dropping anything logged after `completed_steps`
        (everything when it is 0: the run starts over). `sinks` are further backends (W&B,
        MLflow: `nemo_fp8_rl.engines.local.backends`), each given every step's metrics."""
        self.sinks = list(sinks)
        self.path = run_dir / "metrics.jsonl"
        keep_completed_rows(self.path, completed_steps)
        self._file = open_append(self.path)  # never through a link planted in the run dir
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                log_dir=str(run_dir / "logs" / "tb"),
                purge_step=completed_steps + 1 if completed_steps else None,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one step's metrics (flushed at once so a crash loses at most this line)."""
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            for name, value in metrics.items():
                if math.isfinite(float(value)):
                    self._tb.add_scalar(name, float(value), step)
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_event(self, record: dict[str, Any]) -> None:
        """Append an event line (`{"step": k, "event": {...}}`, e.g. a health event) to the
        JSONL only: its fields are not metrics."""
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush and close the sinks."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for sink in self.sinks:
            sink.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """All records of a run's `metrics.jsonl`, in order."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


class _HeadlineProgress(Progress):
    """A progress bar with the latest headline numbers on their own line below it."""

    headline = ""

    def get_renderables(self) -> Iterator[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        yield Text(self.headline, no_wrap=True, overflow="ellipsis")


class ProgressBar:
    """A rich progress bar over GRPO steps showing the headline numbers of the last step, when
    `enabled` and stdout is a terminal; otherwise a plain log line every `every` steps (10, or
    a tenth of a shorter run). The legend of the headline is printed once, at the start."""

    def __init__(
        self,
        total: int,
        start: int,
        *,
        enabled: bool,
        name: str,
        every: int | None = None,
        terminal: bool | None = None,
    ) -> None:
        """Start the bar at `start` of `total` steps; `terminal` (default: whether stdout is
        one) says whether a live bar can be drawn."""
        self._last: dict[str, float] = {}
        self._bar = None
        every = every if every is not None else min(10, max(1, total // 10))
        self._step, self._total, self._every, self._name = start, total, max(every, 1), name
        if enabled and (sys.stdout.isatty() if terminal is None else terminal):
            self._bar = _HeadlineProgress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(bar_width=30),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("grpo", total=total, completed=start)
            self._bar.console.print(f"[bold]{name}[/bold]: GRPO steps {start}..{total}")
            self._bar.console.print(LEGEND, style="dim", highlight=False)
            self._bar.start()
        else:
            print(f"{name}: GRPO steps {start}..{total}, a line every {self._every} steps")
            print(f"  ({LEGEND})", flush=True)

    def update(self, metrics: dict[str, float]) -> None:
        """Advance one step and refresh the headline numbers."""
        self._last.update({k: v for k, v in metrics.items() if v is not None})
        self._step += 1
        if self._bar is None:
            if self._step % self._every == 0 or self._step == self._total:
                print(
                    f"{self._name} step {self._step}/{self._total} {self._headline()}", flush=True
                )
            return
        self._bar.headline = self._headline(self._bar.console.width)
        self._bar.update(self._task, advance=1)

    def _parts(self) -> list[str]:
        """The headline fields of the latest metrics, most important first."""
        parts = []
        for label, key, fmt in HEADLINE:
            if key is None:
                if "train/calib_low" in self._last:
                    parts.append(
                        f"L,H {self._last['train/calib_low']:.3f},{self._last['train/calib_high']:.3f}"
                    )
            elif key in self._last:
                parts.append(f"{label} {fmt.format(self._last[key])}")
        if "timing/train/total_step_time" in self._last:
            parts.append(f"{self._last['timing/train/total_step_time']:.2f} s/step")
        return parts

    def _headline(self, width: int | None = None) -> str:
        """The headline as one line; with `width`, the fields that fit in it (whole fields,
        the least important left out first)."""
        line = ""
        for part in self._parts():
            candidate = f"{line} {part}" if line else part
            if width is not None and len(candidate) > width:
                break
            line = candidate
        return line

    def close(self) -> None:
        """Stop drawing the bar."""
        if self._bar is not None:
            self._bar.stop()
