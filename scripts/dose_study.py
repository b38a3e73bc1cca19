"""Precision dose study: BF16 and four low-precision formats, each uncalibrated and calibrated.

The design is pre-registered in `nemo_fp8_rl/study/endpoints.yaml` (`dose:`); the recipes are in
`recipes/study/dose/`. Runs go seed-major over the arms of the formats named (the study's
`run_order` puts the extremes first), so that a study cut short still holds paired seeds.

    python scripts/dose_study.py run --formats bf16 --seeds 1-3,5-6 --jobs 2 --out runs/dose
    python scripts/dose_study.py threshold --out runs/dose          # the BF16 surge threshold
    python scripts/dose_study.py run --formats fp8-block,nvfp4 --seeds 1-3,5-6 --out runs/dose
    python scripts/dose_study.py passk --out runs/dose              # pass@k of every finished run
    python scripts/dose_study.py archive --out runs/dose            # -> docs/study/dose/runs
    python scripts/dose_study.py table                              # verdict and tables from the archive
    python scripts/dose_study.py figure                             # docs/study/dose/*.png

`threshold` prints the surge threshold the pre-registered rule gives (mean + 2 SD of the BF16
arm's largest entropy rise) and, with `--write`, writes it into the endpoints file, which must
then be committed before any low-precision run starts.

Errors are the package's: one line `error: <where>: <what>. Fix: <how>`, exit 2 for bad usage
or input, 1 for a runtime fault, 130 after Ctrl-C; every file goes through the project's safe
writes (never through a link) and a generated block is written only once all of it is computed.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "scripts/dose_study.py"
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.cli.common import (  # noqa: E402
    SEEDS_SYNTAX,
    ArgumentParser,
    invoke,
    positive_int,
)
from nemo_fp8_rl.config.safe_files import write_atomic  # noqa: E402
from nemo_fp8_rl.config.user_error import UsageError, shown  # noqa: E402
from nemo_fp8_rl.runs.seeds import parse_seeds  # noqa: E402
from nemo_fp8_rl.study import analysis, dose, dose_report, endpoints, grid  # noqa: E402


def run(formats: list[str], seeds: list[int], out: Path, jobs: int) -> int:
    """Run every arm of `formats` over `seeds`, seed-major; returns the number of failed runs."""
    recipes = [dose.RECIPES / f"{arm}.yaml" for arm in dose.arms(formats)]
    if (
        any(fmt != "bf16" for fmt in formats)
        and endpoints.load().dose.entropy_surge.threshold is None
    ):
        raise UsageError(
            "--formats",
            "the surge threshold is not fixed yet, and low-precision arms need it",
            "run the BF16 arm, then `threshold --write` and commit the endpoints file",
        )
    # On a shared machine Ray's memory monitor kills the study's small actors (~0.5 GB each)
    # for other processes' memory; the kernel's OOM killer still guards the machine.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    by_recipe = grid.plan(recipes, seeds, out)
    specs = sorted(by_recipe, key=lambda s: (seeds.index(s.seed), recipes.index(s.recipe)))
    for spec in specs:
        grid.action(spec)
    results = grid.run_all(specs, jobs=jobs)
    return sum(r.returncode != 0 for r in results)


def threshold(out: Path, write: bool) -> int:
    """Print (and with `write`, record) the BF16 arm's surge threshold."""
    ep = endpoints.load()
    runs = [r for r in sorted((out / dose.arm_name("bf16")).glob("seed-*")) if dose.finished(r)]
    rises = [
        dose.largest_rise(analysis.read_records(r), ep.dose.entropy_surge.window) for r in runs
    ]
    try:
        value = dose.surge_threshold(rises)
    except ValueError as exc:
        raise UsageError(f"--out {out}", str(exc), "run the BF16 arm over more seeds") from exc
    print(f"BF16 largest entropy rise over {len(rises)} seeds: {rises}; threshold {value:.4f}")
    if write:
        text = endpoints.FILE.read_text(encoding="utf-8")
        new, count = re.subn(r"(\n    threshold: )null\n", rf"\g<1>{value:.4f}\n", text)
        if count != 1:
            raise UsageError(
                endpoints.FILE,
                "has no `threshold: null` under dose: (fixed already?); nothing was written",
                "set it back to null to record a new threshold",
            )
        write_atomic(endpoints.FILE, new)
        print(f"wrote threshold {value:.4f} to {endpoints.FILE}")
    return 0


def _formats(text: str) -> list[str]:
    """`--formats` as a list, each a known format (else a located usage error)."""
    formats = text.split(",")
    try:
        dose.arms(formats)
    except ValueError as exc:
        raise UsageError(f"--formats {shown(text)}", str(exc), "see --help") from exc
    return formats


def _seeds(text: str) -> list[int]:
    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise UsageError(f"--seeds {shown(text)}", str(exc), f"give {SEEDS_SYNTAX}") from exc


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one sub-command; returns the exit code."""
    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["run", "threshold", "passk", "archive", "table", "figure"])
    ap.add_argument(
        "--formats", default="bf16", help="bf16 and/or formats of the study, comma-separated"
    )
    ap.add_argument("--seeds", default="1-3,5-6")
    ap.add_argument("--out", type=Path, default=Path("runs/dose"))
    ap.add_argument(
        "--jobs", type=positive_int, default=1, help="runs at a time (each uses one thread)"
    )
    ap.add_argument(
        "--write",
        action="store_true",
        help="threshold: write it to endpoints.yaml; table: write the verdict and tables into "
        "docs/study/dose.md (README's sentences: scripts/readme_evidence.py --write README.md)",
    )
    args = ap.parse_args(argv)
    if args.what == "run":
        return 1 if run(_formats(args.formats), _seeds(args.seeds), args.out, args.jobs) else 0
    if args.what == "threshold":
        return threshold(args.out, args.write)
    if args.what == "passk":
        return dose.pass_at_k_all(args.out)
    if args.what == "archive":
        dose.archive(args.out)
        return 0
    if args.what == "figure":
        for path in dose_report.figures():
            print(path)
        return 0
    from nemo_fp8_rl.study import dose_verdict

    text = dose_report.markdown()
    table = dose_report.collect()
    verdict = dose_verdict.verdict(table)
    if args.write:
        dose_report.write_docs(text, verdict)
    print(f"{verdict}\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(invoke(main, prog=PROG))
