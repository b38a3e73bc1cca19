"""README's "What the CPU evidence shows": its paragraph in plain words, every number from
committed data.

    uv run python scripts/readme_evidence.py                 # print the paragraph
    uv run python scripts/readme_evidence.py --write README.md

From the precision dose study's archive (`docs/study/dose/runs/`, `study.dose_verdict`): block
FP8's same-token quotient of lower-bound clipped A<0 tokens (FP8 ÷ BF16 shadow on the shadow
steps), the 4-bit losses against BF16 and which survives a Holm correction over the formats, and
the upper ends of calibration's recovery intervals at NVFP4 and MXFP4; from the rescue study's
archive (`docs/study/rescue/runs/`), how many of its pre-registered runs exist. Intervals: 95 %
Student-t over seeds, paired by seed (quotients: geometric mean of per-seed quotients,
t-interval of their logs). `tests/test_docs_generated.py` regenerates the paragraph and
compares it with README's block. Errors are the package's (`error: <where>: <what>. Fix:
<how>`, exit 2 for bad input, 130 after Ctrl-C); README is written once, atomically, after the
whole paragraph is computed, never through a link.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.cli.common import ArgumentParser, invoke  # noqa: E402
from nemo_fp8_rl.study import analysis, endpoints, rescue_report  # noqa: E402
from nemo_fp8_rl.study.doc_blocks import write_block  # noqa: E402
from nemo_fp8_rl.study.dose_report import collect  # noqa: E402
from nemo_fp8_rl.study.dose_verdict import LABEL, losses_holm, per_format  # noqa: E402

BEGIN, END = "<!-- evidence:begin -->", "<!-- evidence:end -->"
PROG = "scripts/readme_evidence.py"
ALPHA = 0.05


def _quotient(table: dict, arm: str) -> str:
    """Same tokens on the shadow steps: the arm's FP8 ÷ BF16 share of A<0 tokens below the
    nominal lower bound (geometric mean of per-seed quotients, t-interval of their logs)."""
    runs = table[arm]
    return analysis.paired(
        {s: v["shadow_fp8_lower_frac_neg"] for s, v in runs.items()},
        {s: v["shadow_bf16_lower_frac_neg"] for s, v in runs.items()},
        "ratio",
    ).fmt("{:.2f}")


def _rescue_progress() -> str:
    """How many of the rescue study's pre-registered runs are archived."""
    design = endpoints.load().rescue
    done = sum(len(runs) for runs in rescue_report.collect().values())
    planned = len(rescue_report.arms()) * len(design.seeds)
    return f"{done} of the {planned} runs of its first two phases"


def paragraph() -> str:
    """README's evidence, in plain words, every number from the committed archives."""
    table = collect()
    listed = per_format(table)
    rows = {r["format"]: r for r in listed}
    up = {f: rows[f]["recovery"].high for f in ("nvfp4", "mxfp4")}
    holm_p = losses_holm(listed, table)
    kept = [LABEL[f] for f, p in holm_p.items() if p < ALPHA and rows[f]["loss"].mean < 0]
    fp8_kept = [k for k in kept if "FP8" in k]
    return (
        "On a 0.4 M-parameter Qwen3 trained on CPU with the formats emulated, FP8 (block scaling "
        "or MXFP8) puts more negative-advantage tokens below the lower clip bound (block FP8: "
        f"{_quotient(table, 'fp8-block-uncalibrated')} times BF16's share on the same tokens) "
        + (
            f"with an accuracy cost at {', '.join(fp8_kept)}"
            if fp8_kept
            else f"without an accuracy cost that holds after a correction over the {len(listed)} "
            "formats tried"
        )
        + ", while the 4-bit formats' accuracy falls below BF16's (accuracy gain from step 0, "
        "against BF16: MXFP4 "
        f"{rows['mxfp4']['loss'].fmt('{:+.3f}')}, NVFP4 {rows['nvfp4']['loss'].fmt('{:+.3f}')}; "
        f"below 0 after a Holm correction over the formats: {', '.join(kept) or 'none'}). "
        "The runs do not show Calibrated Clipping giving accuracy "
        f"back at any format: the most its intervals still allow is {up['nvfp4']:+.3f} at NVFP4 "
        f"and {up['mxfp4']:+.3f} at MXFP4 (95 % Student-t, paired by seed). Whether the 4-bit "
        "loss is caused by clipping at all is the question of a pre-registered rescue study, "
        f"which has {_rescue_progress()} and no verdict yet; until it has one, turn calibration "
        "on to hold lower-bound clipping near BF16's, not to buy accuracy "
        "([when to turn it on](docs/calibrated-clipping.md#when-to-turn-calibrated-clipping-on)). "
        "Tables, figures and what the runs cannot show: [the dose study](docs/study/dose.md), "
        "[the rescue study](docs/study/rescue.md), [the mechanism study](docs/study/README.md)."
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
