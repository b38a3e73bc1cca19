"""Read the metrics of a finished or running training run, from either engine.

Two sources carry the same metric names (`docs/architecture.md`, "Metric names"):

- `metrics.jsonl` in a project run directory: one JSON object per line,
  `{"step": int, "<metric>": float, ...}`. Several lines may share a step (validation is
  logged apart from training; a resumed run repeats steps): the later value wins.
- TensorBoard event files (`events.out.tfevents.*`), as written by NeMo RL's
  `TensorboardLogger` (`<log_dir>/exp_NNN/tensorboard/`) or by the embedded engine
  (`<run_dir>/logs/tb/`). Scalars are read from `simple_value` (torch's `SummaryWriter`) or a
  scalar tensor (TensorBoard's own writer).

Event files are parsed directly: a TFRecord is `uint64 length | uint32 crc(length) | data |
uint32 crc(data)` with `data` an `Event` protobuf. That is about ten times faster than
TensorBoard's `EventFileLoader` without TensorFlow, which matters for comparing long runs.

A run in progress, a half-written last line or record, NaN values and missing metrics are all
normal: they are reported in `RunData.notes`, never raised. Only a path that holds no metrics
at all is an error.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nemo_fp8_rl.config.safe_files import read_prefix
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.runs import scores
from nemo_fp8_rl.runs.rundir import read_environment

JSONL_NAME = "metrics.jsonl"
RECIPE_NAME = "recipe.yaml"
EVENT_GLOB = "events.out.tfevents.*"
_TFRECORD_HEADER = 12  # uint64 length + uint32 masked crc of the length
_TFRECORD_FOOTER = 4  # uint32 masked crc of the data

# Canonical name first, then the names NeMo RL logs the same quantity under.
ALIASES: dict[str, tuple[str, ...]] = {
    "timing/train/generate": ("timing/train/generation",),
    "timing/train/logprobs": ("timing/train/policy_and_reference_logprobs",),
    "timing/train/refit": (
        "timing/train/prepare_for_generation/total",
        "timing/train/prepare_for_generation",
    ),
    "throughput/tokens_per_sec": ("timing/train/valid_tokens_per_sec_per_gpu",),
    "train/entropy": ("train/approx_entropy",),
    # runs without the BF16-generation score: the rollout engine's (`runs.scores`), with a note
    scores.BF16_ACCURACY: (scores.ROLLOUT_ACCURACY,),
}

Rows = dict[int, dict[str, float]]


class RunReadError(UsageError, ValueError):
    """A path given as a run holds no readable metrics."""


@dataclass(frozen=True)
class Series:
    """One metric over steps: `steps` sorted and unique, `values` may hold NaN."""

    steps: np.ndarray
    values: np.ndarray

    def finite(self) -> Series:
        """The same series without its NaN and infinite points."""
        keep = np.isfinite(self.values)
        return Series(self.steps[keep], self.values[keep])

    def __len__(self) -> int:
        return int(self.steps.size)


@dataclass
class RunData:
    """Everything read from one run: metrics by name, the resolved recipe, and notes."""

    name: str
    path: Path
    metrics: dict[str, Series]
    sources: list[Path]
    config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] | None = None  # the run's environment.json, when readable

    def get(self, metric: str) -> Series | None:
        """The metric's series, or None when this run never logged it."""
        return self.metrics.get(metric)

    def find(self, metric: str) -> tuple[Series | None, str | None]:
        """The series of `metric` or of its first logged alias (`ALIASES`), and the name found."""
        for name in (metric, *ALIASES.get(metric, ())):
            found = self.metrics.get(name)
            if found is not None:
                return found, name
        return None, None

    @property
    def last_step(self) -> int:
        """The highest step with any metric (-1 for an empty run)."""
        return max((int(s.steps[-1]) for s in self.metrics.values() if len(s)), default=-1)

    @property
    def max_steps(self) -> int | None:
        """`grpo.max_num_steps` from the run's recipe, when known."""
        value = ((self.config or {}).get("grpo") or {}).get("max_num_steps")
        return int(value) if isinstance(value, int | float) else None


MAX_STEP = 2**53  # steps beyond this are not whole numbers a float (or a plot axis) holds


def _whole_step(step: object) -> bool:
    """A step is a whole number in [0, MAX_STEP] (1e300, inf or -3 are no step)."""
    if isinstance(step, bool) or not isinstance(step, int | float):
        return False
    if isinstance(step, float) and not math.isfinite(step):
        return False
    return 0 <= step <= MAX_STEP and step == int(step)


def _as_float(value: Any) -> float | None:
    """A JSON value as a float metric; None for what is not a number (strings, lists, bools)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_jsonl(path: Path) -> tuple[Rows, list[str]]:
    """Read `metrics.jsonl` into `{step: {metric: value}}`, later lines overriding earlier ones.

    A line that does not parse is skipped with a note; when it is the last line the note says
    the run may still be writing it. `null` and `NaN` values become NaN.
    """
    rows: Rows = {}
    notes: list[str] = []
    lines = _read_metrics(path, MAX_METRICS_BYTES, notes).decode("utf-8", "replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, or a number past Python's digit limit
            where = "last line" if i == last else "line"
            hint = " (a run still writing it?)" if i == last else ""
            msg = getattr(exc, "msg", None) or "a number too long to read"
            notes.append(f"{path}: {where} {i + 1} is not valid JSON{hint}, skipped: {msg}")
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if not _whole_step(step):
            notes.append(f"{path}: line {i + 1} has no integer 'step' in [0, 2**53], skipped")
            continue
        target = rows.setdefault(int(step), {})
        for key, value in record.items():
            number = _as_float(value)
            if key != "step" and number is not None:
                target[key] = number
    return rows, notes


# What a run's metrics take: far below these; past them a file is read up to the bound, with a
# note (a 2 GB tail of NULs left by a crash is not read for minutes).
MAX_METRICS_BYTES = 256 * 2**20
MAX_EVENT_BYTES = 256 * 2**20


def _read_metrics(path: Path, limit: int, notes: list[str], text: bool = True) -> bytes:
    """The first `limit` bytes of a metrics or event file and, for a `text` file, without a
    trailing run of NULs (an event file's tail is `_tfrecords`'s: its last CRC byte may be 0);
    a note says where reading stopped and why."""
    data, size = read_prefix(path, limit, "metrics file")
    if size > limit:
        notes.append(f"{path}: {size:,} bytes, read only the first {limit:,}")
    if not text:
        return data
    kept = data.rstrip(b"\0")
    if len(data) - len(kept) > 1:
        notes.append(f"{path}: NUL bytes from byte {len(kept):,} on (a crash?), not read")
        return kept
    return data


def _tfrecords(data: bytes, path: Path, notes: list[str]) -> Iterator[bytes]:
    """Split TFRecord framing; a truncated tail (a writer mid-record) ends the file with a note."""
    pos = 0
    while pos < len(data):
        if data[pos : pos + _TFRECORD_HEADER] == bytes(_TFRECORD_HEADER):
            # no record starts with 12 NUL bytes (its length's CRC is never 0): what a crash
            # leaves in a preallocated file
            notes.append(f"{path}: NUL bytes from byte {pos:,} on, not records; rest skipped")
            return
        if pos + _TFRECORD_HEADER > len(data):
            notes.append(f"{path}: truncated record header at byte {pos} (run still writing?)")
            return
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + _TFRECORD_HEADER + length
        if end + _TFRECORD_FOOTER > len(data):
            notes.append(f"{path}: truncated record at byte {pos} (run still writing?)")
            return
        yield data[pos + _TFRECORD_HEADER : end]
        pos = end + _TFRECORD_FOOTER


def _scalar_of(value: Any) -> float | None:
    """The scalar in a `Summary.Value`: `simple_value`, or a one-element tensor."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        from tensorboard.util import tensor_util

        array = tensor_util.make_ndarray(value.tensor)
        if array.size == 1 and np.issubdtype(array.dtype, np.number):
            return float(array.reshape(()))
    return None


def read_event_file(path: Path) -> tuple[Rows, list[str]]:
    """Read the scalar summaries of one TensorBoard event file into `{step: {tag: value}}`."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import event_pb2

    rows: Rows = {}
    notes: list[str] = []
    for record in _tfrecords(_read_metrics(path, MAX_EVENT_BYTES, notes, text=False), path, notes):
        try:
            event = event_pb2.Event.FromString(record)
        except DecodeError:
            notes.append(f"{path}: a record does not decode as an Event; rest of file skipped")
            break
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            number = _scalar_of(value)
            if number is not None:
                rows.setdefault(int(event.step), {})[value.tag] = number
    return rows, notes


def find_event_files(root: Path) -> list[Path]:
    """Event files under `root`, oldest first (their names start with the creation time)."""
    files = [p for p in root.rglob(EVENT_GLOB) if p.is_file()]
    return sorted(files, key=_event_file_time)


def _event_file_time(path: Path) -> tuple[int, str]:
    """Sort key: the creation time in `events.out.tfevents.<time>.<host>...`, then the path."""
    stamp = path.name.split(".")[3] if path.name.count(".") >= 3 else ""
    return (int(stamp) if stamp.isdigit() else 0, str(path))


def merge_rows(parts: Iterable[Rows]) -> Rows:
    """Merge row maps in order; a later value for the same step and metric wins."""
    merged: Rows = {}
    for rows in parts:
        for step, values in rows.items():
            merged.setdefault(step, {}).update(values)
    return merged


def rows_to_series(rows: Rows) -> dict[str, Series]:
    """Turn `{step: {metric: value}}` into one sorted `Series` per metric."""
    columns: dict[str, tuple[list[int], list[float]]] = {}
    for step in sorted(rows):
        for key, value in rows[step].items():
            steps, values = columns.setdefault(key, ([], []))
            steps.append(step)
            values.append(value)
    return {
        key: Series(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
        for key, (s, v) in columns.items()
    }


def _read_config(root: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The resolved `recipe.yaml` saved in the run directory, if there is one."""
    path = root / RECIPE_NAME
    if not path.is_file():
        return None, []
    from nemo_fp8_rl.config.errors import RecipeError
    from nemo_fp8_rl.config.safe_yaml import load_yaml_file

    try:
        config = load_yaml_file(path)
    except RecipeError as exc:
        return None, [f"{path}: not a readable recipe, ignored ({exc.issues[0].what})"]
    if not isinstance(config, dict):
        return None, [f"{path}: not a mapping, recipe ignored"]
    return config, []


def _sources(path: Path) -> tuple[Path, list[Path], list[Path]]:
    """The run root, its JSONL files and its event files, for a run dir or a metrics file."""
    if path.is_file():
        if path.name.startswith("events.out.tfevents."):
            return path.parent, [], [path]
        return path.parent, [path], []
    jsonl = path / JSONL_NAME
    if jsonl.is_file():
        return path, [jsonl], []
    return path, [], find_event_files(path)


def load_run(path: str | Path, name: str | None = None) -> RunData:
    """Read one run: a project run directory, a NeMo RL log directory, or a metrics file.

    A project run directory is read from `metrics.jsonl` (the TensorBoard copy holds the same
    numbers); any other directory from every event file below it, merged in creation order.

    Raises:
        RunReadError: the path does not exist or holds no metrics.
    """
    path = Path(path)
    if not path.exists():
        raise RunReadError(f"run {path}", "no such file or directory", "check the path")
    root, jsonl_files, event_files = _sources(path)
    if not jsonl_files and not event_files:
        raise RunReadError(
            f"run {path}",
            f"found neither {JSONL_NAME} nor TensorBoard event files ({EVENT_GLOB}) below it",
            "pass a run directory (runs/<name>) or a NeMo RL log_dir",
        )
    notes: list[str] = []
    parts: list[Rows] = []
    for file in jsonl_files:
        rows, file_notes = read_jsonl(file)
        parts.append(rows)
        notes += file_notes
    for file in event_files:
        rows, file_notes = read_event_file(file)
        parts.append(rows)
        notes += file_notes
    folders = sorted({str(f.parent) for f in event_files})
    if len(folders) > 1:  # NeMo RL starts a new exp_NNN folder per launch, e.g. on resume
        notes.append(
            f"{path}: merged event files from {len(folders)} folders in time order, later values "
            f"winning: {', '.join(folders)}; pass one folder to read one experiment only"
        )
    metrics = rows_to_series(merge_rows(parts))
    if not metrics:
        raise RunReadError(
            f"run {path}",
            f"{', '.join(map(str, jsonl_files + event_files))} hold no metrics",
            "pass a run that has logged at least one step",
        )
    config, config_notes = _read_config(root)
    run = RunData(
        name or root.name, root, metrics, jsonl_files + event_files, config, notes + config_notes
    )
    run.environment = read_environment(root)
    _note_progress(run)
    note = non_finite_note(run)
    if note:
        run.notes.append(note)
    return run


# Metrics that are NaN (or ±inf) by definition on a step with nothing to measure: the entropy
# quartile shares when no token was clipped, the calibration balance when a sign had no token,
# the FP8 ÷ BF16 clipped-token count when BF16 clipped none. Their non-finite points mean "none",
# not a fault, so they get no note.
NONE_IS_NAN = (
    "train/overclip_share_entropy_q",
    "train/clip_lower_share_entropy_q",
    "train/calib_rho_",
    "train/clip_ratio_fp8_vs_bf16",
)


def non_finite_note(run: RunData) -> str | None:
    """One note naming every metric with NaN, infinite or null points and how many of its
    points they are (summaries, verdicts and plots use the finite points only); None if none.
    Metrics that are NaN by definition when there is nothing to measure (`NONE_IS_NAN`) are not
    named."""
    counts = {
        name: (int(np.count_nonzero(~np.isfinite(s.values))), len(s))
        for name, s in sorted(run.metrics.items())
        if not name.startswith(NONE_IS_NAN)
    }
    bad = [f"{name} ({n} of {total})" for name, (n, total) in counts.items() if n]
    if not bad:
        return None
    return (
        f"{run.name}: {len(bad)} metric(s) hold NaN, infinite or null points, left out of every "
        f"summary, verdict and plot: {', '.join(bad)}"
    )


def _note_progress(run: RunData) -> None:
    """Add a note when the run stopped (or is still running) before `grpo.max_num_steps`."""
    planned = run.max_steps
    if planned is not None and run.last_step < planned:
        run.notes.append(
            f"{run.name}: incomplete, last step {run.last_step} of {planned} "
            "(still running or stopped early)"
        )
