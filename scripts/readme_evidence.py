"""README's "What the CPU evidence shows": its paragraph, every number from committed data.

    uv run python scripts/readme_evidence.py                 # print the paragraph
    uv run python scripts/readme_evidence.py --write README.md

- the mechanism, in its regime: per-tensor current scaling (the study recipes), same tokens, FP8 ÷
  BF16 shadow ratio below 1 − ε, and the clipped shares of the uncalibrated and calibrated FP8
  runs against BF16 (`nemo_fp8_rl.cli.study.blocks` over `docs/study/runs/`); the tiny default's
  blockwise scaling from the controlled experiment (`docs/study/mechanism.jsonl`, one seed);
- what the study does not show: calibrated − uncalibrated accuracy and the surge statistic
  (the same targets);
- first, the precision dose study's two sentences (`study.dose_verdict.headline` over
  `docs/study/dose/runs/`): at which measured dose calibration starts to matter, if at any.

Intervals: 95 % Student-t over seeds, n beside each (quotients: geometric mean of per-seed
quotients, t-interval of their logs). `tests/test_docs_generated.py` regenerates the paragraph
and compares it with README's block. Errors are the package's (`error: <where>: <what>. Fix:
<how>`, exit 2 for bad input, 130 after Ctrl-C); README is written once, atomically, after the
whole paragraph is computed, never through a link.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.cli.common import ArgumentParser, invoke  # noqa: E402
from nemo_fp8_rl.cli.study import blocks  # noqa: E402
from nemo_fp8_rl.config.safe_files import read_text_bounded  # noqa: E402
from nemo_fp8_rl.config.user_error import UsageError  # noqa: E402
from nemo_fp8_rl.study.doc_blocks import write_block  # noqa: E402
from nemo_fp8_rl.study.dose_report import collect  # noqa: E402
from nemo_fp8_rl.study.dose_verdict import headline  # noqa: E402

BEGIN, END = "<!-- evidence:begin -->", "<!-- evidence:end -->"
DOSE_BEGIN, DOSE_END = "<!-- dose-response:begin -->", "<!-- dose-response:end -->"
STUDY = ROOT / "docs" / "study"
PROG = "scripts/readme_evidence.py"


def _target(rows: list[dict], starts: str, holds: str = ""):
    """The interval of the one target row whose name starts with `starts` and holds `holds`."""
    found = [r for r in rows if r["what"].startswith(starts) and holds in r["what"]]
    if len(found) != 1:
        raise UsageError(
            STUDY / "runs",
            f"{len(found)} study targets named {starts!r}{f' ({holds})' if holds else ''}, "
            "expected one",
            "regenerate the study report (python -m nemo_fp8_rl.study --write-docs)",
        )
    return found[0]["interval"]


def blockwise_default() -> float:
    """FP8 ÷ BF16 share of A<0 tokens whose ratio is below 1 − ε, same tokens, in the tiny
    default (blockwise scaling; one seed, the controlled experiment's first row)."""
    path = STUDY / "mechanism.jsonl"
    for number, line in enumerate(read_text_bounded(path, 2**20, "results file").splitlines()):
        try:
            row = json.loads(line)
            if row["variant"] == "blockwise (default)":
                return row["fp8_nominal_lower_frac_neg"] / row["bf16_lower_frac_neg"]
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            raise UsageError(
                f"{path}:{number + 1}", f"not a result row ({exc})", "regenerate the file"
            ) from exc
    raise UsageError(
        path, "has no 'blockwise (default)' row", "run scripts/fp8_mechanism.py to regenerate it"
    )


def paragraph() -> str:
    """The three sentences and the link, as README holds them between the markers."""
    _, rows, meta = blocks(STUDY / "runs")
    two = "{:.2f}"
    same = _target(rows, "same tokens, FP8 ÷ BF16 shadow ratio").fmt(two)
    clip = _target(rows, "FP8-uncalibrated ÷ BF16 run: share").fmt(two)
    cal = _target(rows, "FP8-calibrated ÷ BF16 run: share").fmt(two)
    recovered = _target(rows, "accuracy (primary", "FP8 calibrated − FP8 uncalibrated").fmt()
    rise = _target(rows, "largest entropy rise", "FP8 uncalibrated − BF16").fmt()
    seeds = len(meta["seeds"])
    dose = headline(collect())
    return (
        f"{DOSE_BEGIN}{dose} Tables, figure and what these runs cannot show: "
        f"[docs/study/dose.md](docs/study/dose.md).{DOSE_END} "
        f"In the mechanism study (a 0.4 M-parameter Qwen3 on synthetic addition, 80 GRPO steps, {seeds} "
        "seeds; intervals: 95 % Student-t over seeds), FP8 training with per-tensor current "
        "scaling puts "
        f"{same} times as many negative-advantage tokens below the lower clip bound as BF16 on the "
        f"same tokens (the tiny default's blockwise scaling: {blockwise_default():.1f}x, one seed), "
        "and Calibrated Clipping, as run then (pool rule `until_min_clipped`, no longer the "
        f"default), cuts FP8's lower-clipped share from {clip} to {cal} times BF16's. It shows "
        "nothing for calibration to give back: with both arms scored by FP8 generation, "
        f"calibrated minus uncalibrated FP8 accuracy is {recovered}, and within 80 steps FP8's "
        f"surge statistic does not differ from BF16's (FP8 − BF16: {rise} nats). Claim by claim, "
        "with what these runs cannot show: "
        "[docs/study/README.md](docs/study/README.md)."
    )


def write(path: Path) -> None:
    """Replace README's evidence block with `paragraph()`."""
    write_block(path, (BEGIN, END), paragraph())


def main(argv: list[str] | None = None) -> int:
    """Print the paragraph, or with --write splice it into README; returns the exit code."""
    ap = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="replace the block in this file (README.md)")
    args = ap.parse_args(argv)
    if args.write:
        write(args.write)
    else:
        print(paragraph())
    return 0


if __name__ == "__main__":
    raise SystemExit(invoke(main, prog=PROG))
