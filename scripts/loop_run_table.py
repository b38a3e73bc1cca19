"""Per-step clip fractions and clip bounds of one run, as the Markdown table docs/cluster.md holds.

Reads a run directory's `metrics.jsonl` (NeMo RL's loop on CPU or the embedded engine; the
committed copy of the MXFP8 loop run is docs/blackwell/runs/grpo-tiny-qwen3-nemo-cpu-fp8-mxfp8)
and prints, per training step: the mean reward, the share of negative-advantage tokens below the
lower clip bound (`train/clip_lower_frac_neg`), of positive-advantage tokens above the upper
bound (`train/clip_upper_frac_pos`), of all tokens clipped (`train/clip_frac`), the bounds in
force (`train/calib_low`, `train/calib_high`), and on calibration steps the targets the BF16
shadow pass gave (`train/calib_low_target`, `train/calib_high_target`; "skipped" when too few
clipped tokens were pooled) and the FP8-vs-BF16 probability and ratio NMAE.

    uv run python scripts/loop_run_table.py docs/blackwell/runs/grpo-tiny-qwen3-nemo-cpu-fp8-mxfp8
    uv run python scripts/loop_run_table.py --archive runs/<name> docs/blackwell/runs/<name>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic

ARCHIVED = ("metrics.jsonl", "environment.json", "recipe.yaml")


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f} %"


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def steps(run: Path) -> dict[int, dict]:
    """Every metric of each step, merged over the file's lines."""
    out: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.setdefault(int(row["step"]), {}).update(row)
    return out


def _calibration(m: dict) -> str:
    if "train/calib_low_target" not in m and "train/calib_skipped" not in m:
        return ""
    if m.get("train/calib_skipped"):
        return "skipped (too few clipped tokens)"
    return (
        f"L* {_num(m.get('train/calib_low_target'))}, H* {_num(m.get('train/calib_high_target'))}"
    )


def table(run: Path) -> str:
    """The Markdown table (module docstring)."""
    lines = [
        "| step | reward | A<0 below L | A>0 above H | all clipped | L, H in force | "
        "calibration (BF16 shadow) | prob NMAE | ratio NMAE |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for step, m in sorted(steps(run).items()):
        if "train/clip_frac" not in m:
            continue
        lines.append(
            f"| {step} | {_num(m.get('train/reward'))} | {_pct(m.get('train/clip_lower_frac_neg'))}"
            f" | {_pct(m.get('train/clip_upper_frac_pos'))} | {_pct(m.get('train/clip_frac'))} | "
            f"{_num(m.get('train/calib_low'))}, {_num(m.get('train/calib_high'))} | "
            f"{_calibration(m)} | {_num(m.get('train/prob_nmae'), 4)} | "
            f"{_num(m.get('train/ratio_nmae'), 4)} |"
        )
    return "\n".join(lines)


def archive(run: Path, dest: Path) -> None:
    """Copy the files the table and its provenance need into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ARCHIVED:
        write_atomic(dest / name, (run / name).read_bytes())  # never through a link


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory holding metrics.jsonl")
    parser.add_argument("dest", type=Path, nargs="?", help="with --archive: where to copy it")
    parser.add_argument("--archive", action="store_true", help=f"copy {', '.join(ARCHIVED)}")
    args = parser.parse_args(argv)
    if args.archive:
        if args.dest is None:
            parser.error("--archive needs a destination folder")
        archive(args.run, args.dest)
        return 0
    print(table(args.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
