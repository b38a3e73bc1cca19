"""Setup and per-step times of NeMo RL's loop on CPU, from finished run directories.

    python benchmarks/cpu_loop_times.py RUN_DIR [RUN_DIR ...]

For each run: the stages `environment.json` records (`seconds`: hand-off, Ray's start, tokenizer
and data, NeMo RL's setup and training, total), setup = setup_and_training minus the steps'
`timing/train/total_step_time` and the validations' `timing/validation/total_validation_time`,
then each step's time, its refit (`prepare_for_generation/total`) and generation times, and the
1-minute load average NeMo RL's logger line recorded (`system/load_average_1min`). A resumed
run's `metrics.jsonl` holds both attempts' lines; the later line of a step wins.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEP = "timing/train/total_step_time"
REFIT = "timing/train/prepare_for_generation/total"
GEN = "timing/train/generation"
VAL = "timing/validation/total_validation_time"
LOAD = "system/load_average_1min"


def per_step(run: Path) -> dict[int, dict]:
    """Each step's merged metrics (later lines win)."""
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(row["step"], {}).update(row)
    return out


def report(run: Path) -> str:
    """The lines printed for one run."""
    seconds = json.loads((run / "environment.json").read_text()).get("seconds", {})
    steps = per_step(run)
    stepped = sum(r.get(STEP, 0.0) for r in steps.values())
    validated = sum(r.get(VAL, 0.0) for r in steps.values())
    lines = [f"{run}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())]
    if "setup_and_training" in seconds:
        setup = seconds["setup_and_training"] - stepped - validated
        lines.append(f"  setup (NeMo RL's setup, engine, workers) {setup:.1f} s; steps {stepped:.1f}"
                     f" s; validation {validated:.1f} s")  # fmt: skip
    for k in sorted(s for s in steps if STEP in steps[s]):
        r = steps[k]
        lines.append(f"  step {k:2d}: {r[STEP]:6.2f} s (refit {r.get(REFIT, float('nan')):.2f} s,"
                     f" generation {r.get(GEN, float('nan')):.2f} s), load {r.get(LOAD, float('nan')):.2f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for arg in argv:
        print(report(Path(arg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
