"""Time `nemo_fp8_rl.compare` on two 500-step runs, and the event-file reader against TensorBoard's.

Run: `uv run python benchmarks/bench_compare.py [--steps 500]`. Writes a BF16 and an FP8 run
(metrics.jsonl, and NeMo RL-style TensorBoard events with torch's SummaryWriter) to a temporary
directory, then prints:
- the wall and CPU time of the whole command (`python -m nemo_fp8_rl.compare A B --out R`, a
  fresh process, as a user sees it) for project runs and for NeMo RL event files, with and
  without plots, against the 3 s budget (on a busy machine only the CPU time is meaningful);
- the time to read the event files with `nemo_fp8_rl.analysis.rundata` and with TensorBoard's
  `EventFileLoader` (the baseline), and their ratio.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 3.0


def _metrics(step: int, steps: int, step_s: float) -> dict[str, float]:
    wiggle = math.sin(1.3 * step)
    out = {
        "train/reward": 0.2 + 0.5 * step / steps + 0.01 * wiggle,
        "train/entropy": 0.8 + 0.004 * wiggle,
        "timing/train/total_step_time": step_s * (1 + 0.02 * wiggle),
    }
    for i in range(30):  # the rest of a realistic set of names
        out[f"train/metric_{i}"] = wiggle * i
    if step % 25 == 0:
        out["validation/accuracy"] = 0.6 * step / steps
    return out


def write_runs(root: Path, steps: int) -> list[Path]:
    """Two project runs (JSONL + TensorBoard copy) of `steps` steps each."""
    from nemo_fp8_rl.engines.local.metrics import MetricsLogger

    dirs = []
    for name, step_s in (("bf16", 2.0), ("fp8", 1.6)):
        run_dir = root / name
        run_dir.mkdir()
        logger = MetricsLogger(run_dir, tensorboard=True)
        for step in range(1, steps + 1):
            logger.log(step, _metrics(step, steps, step_s))
        logger.close()
        dirs.append(run_dir)
    return dirs


def time_cli(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of `python -m nemo_fp8_rl.compare ARGS` in a fresh process.

    CPU time (user + system) is what the command costs on an idle machine; wall time also
    counts waiting for cores other processes hold.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nemo_fp8_rl.compare", *args], check=True, capture_output=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def time_readers(event_files: list[Path]) -> tuple[float, float]:
    """(ours, TensorBoard EventFileLoader) seconds to read the scalars of `event_files`."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from nemo_fp8_rl.analysis.rundata import read_event_file

    start = time.perf_counter()
    for path in event_files:
        read_event_file(path)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for path in event_files:
        for event in EventFileLoader(str(path)).Load():
            for _ in event.summary.value:
                pass
    return ours, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    steps = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = write_runs(root, steps)
        tb = [str(r / "logs") for r in runs]
        cases = {
            "project runs (metrics.jsonl), plots": [*map(str, runs), "--out", tmp + "/r1"],
            "project runs, --no-plots": [*map(str, runs), "--out", tmp + "/r2", "--no-plots"],
            "event files only, plots": [*tb, "--out", tmp + "/r3"],
        }
        print(f"two runs of {steps} steps; budget {BUDGET_S:.1f} s; load {os.getloadavg()[0]:.1f}")
        for label, args in cases.items():
            wall, cpu = min(time_cli(args) for _ in range(3))
            print(
                f"  {label:38s} wall {wall:6.2f} s ({wall / BUDGET_S:4.2f} of budget)"
                f"  cpu {cpu:5.2f} s ({cpu / BUDGET_S:4.2f} of budget)"
            )
        events = sorted(root.rglob("events.out.tfevents.*"))
        ours, baseline = time_readers(events)
        print(f"  read events, EventFileLoader (baseline) {baseline * 1e3:7.1f} ms")
        print(
            f"  read events, nemo_fp8_rl.analysis.rundata           {ours * 1e3:7.1f} ms  ({baseline / ours:4.1f}x faster)"
        )


if __name__ == "__main__":
    main()
