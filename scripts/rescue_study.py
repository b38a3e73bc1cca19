"""4-bit rescue study: is the dose study's 4-bit accuracy loss clip-mediated, what gives it back?

The design is pre-registered in `nemo_fp8_rl/study/endpoints.yaml` (`rescue:`); the recipes are in
`recipes/study/rescue/`. Runs go seed-major over the arms of a phase, so that a study cut short
still holds paired seeds. The reference arms are the dose study's archive, used once `reproduce`
shows an archived run rerun at this commit matching it bit for bit.

    python scripts/rescue_study.py reproduce --out runs/rescue     # rerun the reference run, compare
    python scripts/rescue_study.py run --phase 1 --jobs 2 --out runs/rescue
    python scripts/rescue_study.py passk --out runs/rescue         # pass@k of every finished run
    python scripts/rescue_study.py archive --out runs/rescue       # -> docs/study/rescue/runs
    python scripts/rescue_study.py table [--write]                 # tables and verdict from the archive
    python scripts/rescue_study.py figure                          # docs/study/rescue/*.png

Failures end as one line, `error: <where>: <what>. Fix: <how>`, as the package's commands do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.cli.common import invoke  # noqa: E402
from nemo_fp8_rl.config.safe_files import write_atomic  # noqa: E402
from nemo_fp8_rl.config.user_error import UsageError  # noqa: E402
from nemo_fp8_rl.runs.seeds import parse_seeds  # noqa: E402
from nemo_fp8_rl.study import dose, endpoints, grid, rescue, rescue_report  # noqa: E402
from nemo_fp8_rl.study.doc_blocks import write_block  # noqa: E402


def _launch(recipes: list[Path], seeds: list[int], out: Path, jobs: int) -> int:
    """Run (recipe, seed) pairs seed-major through the study grid; the number that failed."""
    # On a shared machine Ray's memory monitor kills the study's small actors (~0.5 GB each)
    # for other processes' memory; the kernel's OOM killer still guards the machine.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    specs = grid.plan(recipes, seeds, out)
    specs.sort(key=lambda s: (seeds.index(s.seed), recipes.index(s.recipe)))
    for spec in specs:
        grid.action(spec)
    return sum(r.returncode != 0 for r in grid.run_all(specs, jobs=jobs))


def run(phase: int, seeds: list[int], out: Path, jobs: int) -> int:
    """Run the arms of `phase` over `seeds`; 1 when a run failed."""
    try:
        recipes = rescue.recipe_paths(rescue.phase_arms(phase))
    except ValueError as exc:
        raise UsageError(
            "--phase", str(exc), "pick a phase of endpoints.yaml rescue.phases"
        ) from exc
    return 1 if _launch(recipes, seeds, out, jobs) else 0


def reproduce(out: Path, jobs: int) -> int:
    """Rerun the pre-registered reference run at this commit (a finished one in `out` is kept)
    and compare it with its archive: prints the verdict (and up to 20 differences), writes
    `docs/study/rescue/reproducibility.json` (with the rerun's provenance); 0 when bit-identical,
    1 otherwise."""
    spec = endpoints.load().rescue.reproducibility
    name = dose.arm_name(spec.arm)
    run_dir = out / name / f"seed-{spec.seed}"  # also the study's own reference run
    if not dose.finished(run_dir) and _launch(
        [dose.RECIPES / f"{name}.yaml"], [spec.seed], out, jobs
    ):
        return 1
    archived = dose.ARCHIVE / name / f"seed-{spec.seed}" / "metrics.jsonl.gz"
    old = rescue.read_metrics(archived)
    diffs = rescue.reproduce_differences(rescue.read_metrics(run_dir / "metrics.jsonl"), old)
    prov = json.loads((run_dir / grid.PROVENANCE).read_text(encoding="utf-8"))
    record = {"arm": spec.arm, "seed": spec.seed, "identical": not diffs,
              "values_compared": rescue.compared_values(old), "values_differing": len(diffs),
              "differences": diffs[:200], "provenance": prov}  # fmt: skip
    rescue.DOCS.mkdir(parents=True, exist_ok=True)
    write_atomic(rescue.DOCS / "reproducibility.json", json.dumps(record, indent=1) + "\n")
    verdict = "bit-identical" if not diffs else f"{len(diffs)} values differ"
    print(f"{name} seed {spec.seed} rerun at {prov['start']['commit'][:12]}: {verdict} "
          f"(every non-timing value of every step against {archived})")  # fmt: skip
    for line in diffs[:20]:
        print(f"  {line}")
    return 0 if not diffs else 1


RUNS = ("grpo-dose-*", "grpo-rescue-*")  # the study's runs: reference arms, rescue arms


def table(write: bool) -> int:
    """Print (and with `write`, write into docs/study/rescue.md) the tables and verdict; every
    value is computed before anything is written."""
    text = rescue_report.markdown()
    if write:
        write_block(rescue.PAGE, rescue.BLOCK, text)
        print(f"wrote {rescue.PAGE}")
    print(text)
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["reproduce", "run", "passk", "archive", "table", "figure"])
    ap.add_argument("--phase", type=int, default=1, help="run: the pre-registered phase (1-based)")
    ap.add_argument("--seeds", default="1-3,5-6")
    ap.add_argument("--out", type=Path, default=Path("runs/rescue"))
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses one thread)")
    ap.add_argument("--write", action="store_true", help="table: write docs/study/rescue.md")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.jobs < 1:
        raise UsageError("--jobs", f"must be >= 1, got {args.jobs}", "pass --jobs 1 or more")
    if args.what == "reproduce":
        return reproduce(args.out, args.jobs)
    if args.what == "run":
        return run(args.phase, parse_seeds(args.seeds), args.out, args.jobs)
    if args.what == "passk":
        return max(dose.pass_at_k_all(args.out, runs) for runs in RUNS)
    if args.what == "archive":
        for runs in RUNS:
            dose.archive(args.out, rescue.ARCHIVE, runs)
        return 0
    if args.what == "figure":
        print(rescue_report.figure())
        return 0
    return table(args.write)


if __name__ == "__main__":
    raise SystemExit(invoke(main, prog="scripts/rescue_study.py"))
