"""What Calibrated Clipping's BF16 shadow passes cost, measured on both engines from committed runs.

    uv run python scripts/calibration_cost.py            # print the table
    uv run python scripts/calibration_cost.py --write    # into docs/calibrated-clipping.md

Per run: `timing/train/shadow` (the two BF16 shadow forwards and their bookkeeping) over
`timing/train/total_step_time`, summed over the steps that ran a shadow pass, is the shadow's
share of a shadow step; summed over every step it is the share of the run at the run's interval.
At calibration interval K the run-level cost is about `shadow seconds per shadow step / (K ·
mean step seconds)`. Sources: the embedded engine's calibrated arms of the precision dose study
(`docs/study/dose/runs/`, interval 5, 150 steps, 5 seeds per format) and NeMo RL's loop on CPU
(`docs/blackwell/runs/grpo-tiny-qwen3-nemo-cpu-fp8-mxfp8/`, one run, 10 steps). Both ran on 2
shared cores under load; a share divides two times measured under the same load. Intervals: 95 %
Student-t over runs, n beside each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.cli.common import invoke  # noqa: E402
from nemo_fp8_rl.study import analysis  # noqa: E402
from nemo_fp8_rl.study.doc_blocks import write_block  # noqa: E402
from nemo_fp8_rl.study.dose import ARCHIVE  # noqa: E402

PAGE = ROOT / "docs" / "calibrated-clipping.md"
BLOCK = ("<!-- calibration-cost:begin -->", "<!-- calibration-cost:end -->")
NEMO_RUN = ROOT / "docs" / "blackwell" / "runs" / "grpo-tiny-qwen3-nemo-cpu-fp8-mxfp8"
FORMATS = ("fp8-block", "mxfp8", "nvfp4", "mxfp4")


def shares(run_dir: Path) -> tuple[float, float, int]:
    """(share of the shadow steps' time, share of the run's time, shadow steps) of one run."""
    steps = [r for r in analysis.read_records(run_dir) if "timing/train/total_step_time" in r]
    shadow = [r for r in steps if r.get("timing/train/shadow", 0.0) > 0.0]
    spent = sum(r["timing/train/shadow"] for r in shadow)
    total = sum(r["timing/train/total_step_time"] for r in steps)
    per = sum(r["timing/train/total_step_time"] for r in shadow)
    return spent / per, spent / total, len(shadow)


def table() -> str:
    """One row per source: shadow steps, share of a shadow step, share of the run."""
    rows = [
        "| engine, runs | interval | shadow steps per run | share of a shadow step | share of the run |",
        "|---|---|---|---|---|",
    ]
    for fmt in FORMATS:
        runs = sorted((ARCHIVE / f"grpo-dose-{fmt}").glob("seed-*"))
        got = [shares(r) for r in runs]
        step = analysis.mean_interval([g[0] for g in got]).fmt("{:.3f}")
        run = analysis.mean_interval([g[1] for g in got]).fmt("{:.3f}")
        rows.append(f"| embedded, dose study {fmt} calibrated | 5 | {got[0][2]} | {step} | {run} |")
    step, run, n = shares(NEMO_RUN)
    rows.append(
        f"| NeMo RL's loop on CPU, tiny MXFP8 (one run, 10 steps) | 2 | {n} | {step:.3f} (n=1) "
        f"| {run:.3f} (n=1) |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write the table into {PAGE.name}")
    args = ap.parse_args(argv)
    text = table()
    if args.write:
        write_block(PAGE, BLOCK, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(invoke(main, prog="scripts/calibration_cost.py"))
