"""`python -m nemo_fp8_rl.study`: run the CPU study (recipes/study/) over seeds and report it.

Runs the three study recipes over the seeds into `--out` (a finished run with the same settings
is kept; a folder holding anything else is refused before anything starts), then writes the
report (`tables.md`, `results.json`, plots) to `--report` (default `<out>/report`). The
committed report (docs/study/, the README's study table, and the archive of the runs' per-step
metrics in docs/study/runs/) is written only with `--write-docs`. `--analyse-only` reports
runs that exist and refuses (exit 2, nothing written) when there are none.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import time
from pathlib import Path

from nemo_fp8_rl.cli.common import ArgumentParser, positive_int, run_main
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UsageError, shown
from nemo_fp8_rl.runs.seeds import parse_seeds
from nemo_fp8_rl.study import analysis, endpoints, grid, report

ROOT = Path(__file__).resolve().parents[2]
STUDY_DIR = ROOT / "recipes" / "study"
DOCS = ROOT / "docs" / "study"
ROLES = {
    "bf16": "grpo-study-bf16",
    "fp8_uncal": "grpo-study-fp8-uncalibrated",
    "fp8_cal": "grpo-study-fp8",
}
NAMES = [ROLES["bf16"], ROLES["fp8_uncal"], ROLES["fp8_cal"]]
DEFAULT_SEEDS = "1-3,5-6"
META = "study.json"
EXAMPLES = [
    "python -m nemo_fp8_rl.study --seeds 1-3,5-6 --jobs 2 --out runs/study",
    "python -m nemo_fp8_rl.study --analyse-only --out docs/study/runs --report /tmp/study",
]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(
        prog="nemo_fp8_rl.study", description=__doc__.split("\n\n")[1], examples=EXAMPLES
    )
    ap.add_argument(
        "--seeds",
        default=None,
        help=f"seeds as in train --seeds: 1,2,3 or 1-5 or 1-3,7 (default {DEFAULT_SEEDS})",
    )
    ap.add_argument("--jobs", type=positive_int, default=2, help="runs at a time, >= 1 (default 2)")
    ap.add_argument("--out", type=Path, default=Path("runs/study"), help="run folders")
    ap.add_argument("--report", type=Path, default=None, help="report folder (<out>/report)")
    ap.add_argument(
        "--write-docs",
        action="store_true",
        help="also write docs/study/, its runs archive and the README's study table",
    )
    ap.add_argument(
        "--overwrite", action="store_true", help="run again runs that have other settings"
    )
    ap.add_argument("--analyse-only", action="store_true", help="only write the report")
    ap.add_argument(
        "overrides", nargs="*", metavar="key=value", help="overrides for every run (quick checks)"
    )
    args = ap.parse_args(argv)
    _check_overrides(args)
    return args


def _check_overrides(args: argparse.Namespace) -> None:
    """Refuse trailing words that are not overrides (`--seeds 1 2 3` leaves `2 3` here, which
    would otherwise be dropped without a word) and overrides with --analyse-only (which runs
    nothing for them to change)."""
    stray = [w for w in args.overrides if "=" not in w and not w.startswith("~")]
    if stray:
        seeds = ",".join([args.seeds or "", *stray]).strip(",")
        raise UsageError(
            " ".join(stray),
            "not key=value overrides (seeds are one word)",
            f"give seeds as --seeds {seeds} (or a range such as 1-3)",
        )
    if args.overrides and args.analyse_only:
        raise UsageError(
            " ".join(args.overrides),
            "overrides change the runs, and --analyse-only runs nothing",
            "drop the overrides, or drop --analyse-only to run the study with them",
        )


def _check_folder(path: Path, flag: str) -> None:
    """A folder the study may create or write into: no file at it or above it."""
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(
                str(path), f"{part} is a file, not a folder", f"pass {flag} with a folder path"
            )


def settings(names: list[str]) -> str:
    """The study recipes' settings, as a Markdown list."""
    lines = []
    for name in names:
        cfg = load_recipe(STUDY_DIR / f"{name}.yaml").config
        meg, pol, grpo = cfg["policy"]["megatron_cfg"], cfg["policy"], cfg["grpo"]
        fp8, cal = meg["fp8_cfg"], cfg["loss_fn"]["calibration"]
        updates = grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"]
        lines.append(
            f"- `{name}`: FP8 training {'on, ' + fp8['fp8_recipe'] if fp8['enabled'] else 'off'}, "
            f"rollout {pol['generation']['vllm_cfg']['precision']}, "
            f"calibration {_calibration(cal)}, {grpo['max_num_steps']} steps of "
            f"{grpo['num_prompts_per_step']}×{grpo['num_generations_per_prompt']} samples, "
            f"{updates // pol['train_global_batch_size']} updates per batch, micro batch "
            f"{pol['train_micro_batch_size']}, logprob batch {pol['logprob_batch_size']}, "
            f"lr {meg['optimizer']['lr']}, model {cfg['local']['model']['num_layers']} layers × "
            f"{cfg['local']['model']['hidden_size']}"
        )
    return "\n".join(lines)


def _calibration(cal: dict) -> str:
    if not cal["enabled"]:
        return "off"
    return (
        f"on (every {cal['interval']} steps, ≥ {cal['min_tokens']} tokens per sign, "
        f"L* pooled until m_min = {cal['min_clipped_tokens']} clipped tokens, at most "
        f"{cal['max_pool_windows']} windows)"
    )


def _wall(meta: dict) -> str:
    wall = meta.get("study_wall_seconds")
    return f"{wall / 60:.0f} min" if wall else "not recorded"


def full_block(rows: list[dict], table: dict, meta: dict, plots: list[str]) -> str:
    """Everything the study measured, as Markdown (for docs/study/README.md)."""
    seeds = ", ".join(str(s) for s in meta["seeds"])
    return "\n\n".join(
        [
            f"Seeds {seeds}; {meta['jobs']} runs at a time; study wall time {_wall(meta)}"
            + (f"; failed: {', '.join(meta['failed'])}" if meta["failed"] else "")
            + ". Generated by `uv run python -m nemo_fp8_rl.study --analyse-only --out "
            "docs/study/runs --write-docs` from the committed per-step metrics.",
            "**Endpoints** (`nemo_fp8_rl/study/endpoints.yaml`"
            + ("; fixed after these runs were made, so not pre-registered for them"
               if report.scored_with(table) != "BF16-scored" else "")  # fmt: skip
            + "):\n\n"
            + endpoints.describe(endpoints.load()),
            scoring_note(table),
            "**Targets** (mean over seeds [95 % Student-t interval] (n seeds); differences "
            "paired by seed; quotients of shares: geometric mean of per-seed quotients, "
            "t-interval of their logs):",
            report.markdown_targets(rows),
            "**Per recipe** (mean over seeds [95 % Student-t interval] (n seeds)):",
            report.markdown_summary(table, NAMES),
            "**Per seed:**",
            report.markdown_per_seed(table, NAMES),
            "**Settings:**",
            settings(NAMES),
            "\n".join(f"![{Path(p).stem}]({Path(p).name})" for p in plots),
        ]
    )


def headline_block(rows: list[dict], meta: dict, table: dict | None = None) -> str:
    """The targets table and one line of context (for the project README)."""
    seeds = ", ".join(str(s) for s in meta["seeds"])
    note = f"\n\n{scoring_note(table)}" if table is not None else ""
    return (
        f"Seeds {seeds}, `recipes/study/` (study wall time {_wall(meta)}; intervals: 95 % "
        "Student-t over seeds, n beside each; details, per-seed values and plots in "
        "[docs/study/README.md](docs/study/README.md)):"
        + note
        + "\n\n"
        + report.markdown_targets(rows)
    )


def scoring_note(table: dict) -> str:
    """How the accuracies in the tables were scored, said plainly."""
    if report.scored_with(table) == "BF16-scored":
        return "Accuracies: the trained weights generated in BF16 (`validation/bf16_accuracy`)."
    return (
        "**Accuracies in these tables are not BF16 scores.** These runs were made before "
        "validation scored the weights with BF16 generation: each run was scored by its own "
        "rollout engine, so the FP8 recipes' accuracies are FP8-generation scores. The step-0 "
        "row shows what that scoring alone does on identical weights; the accuracy rows mix it "
        "with what training did. The endpoints above were fixed after these runs were made; "
        "they apply as named to runs made from now on."
    )


def read_meta(out: Path) -> dict:
    """`out/study.json` as written by a study ({} when there is none); a garbled one is a
    located error, not a traceback."""
    path = out / META
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            str(path),
            f"not a study record ({type(exc).__name__}: {shown(str(exc))})",
            "delete it and pass --seeds, or run the study again",
        ) from exc
    seeds = meta.get("seeds") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not (
        seeds is None or (isinstance(seeds, list) and all(type(s) is int and s >= 0 for s in seeds))
    ):
        raise UsageError(
            str(path),
            "not a study record (a JSON object whose seeds are a list of whole numbers)",
            "delete it and pass --seeds, or run the study again",
        )
    return meta


def blocks(out: Path, seeds: list[int] | None = None) -> tuple[dict, list[dict], dict]:
    """`(table, target rows, meta)` of the runs in `out` (seeds from `out/study.json` if
    there is one); raises UsageError when no run of the study is there."""
    meta = read_meta(out)
    seeds = seeds if seeds is not None else meta.get("seeds")
    if seeds is None:
        raise UsageError(str(out), f"no {META} naming the seeds", "pass --seeds")
    table = analysis.collect(out, NAMES, seeds)
    if not any(table.values()):
        raise UsageError(
            str(out),
            f"no study runs for seeds {seeds} (nothing was written)",
            "run the study first (without --analyse-only), or pass --out with the folder "
            "holding the runs (the committed ones: docs/study/runs)",
        )
    meta = {"seeds": seeds, "jobs": meta.get("jobs"), "failed": meta.get("failed", []),
            "study_wall_seconds": meta.get("study_wall_seconds"),
            "overrides": meta.get("overrides", [])}  # fmt: skip
    return table, report.targets(table, ROLES), meta


def archive(out: Path, dest: Path, meta: dict) -> None:
    """Copy what the report reads from each finished run (metrics as reproducible gzip, wall
    time) and the study's meta into `dest` (docs/study/runs): the committed data behind the
    tables. A run without `study_wall_seconds.json` (unfinished or failed) is left out."""
    for name in NAMES:
        for seed in meta["seeds"]:
            run = out / name / f"seed-{seed}"
            wall = run / "study_wall_seconds.json"  # written when a run finished
            if analysis.metrics_file(run) is None or not wall.exists():
                continue
            target = dest / name / f"seed-{seed}"
            target.mkdir(parents=True, exist_ok=True)
            text = "".join(json.dumps(r) + "\n" for r in analysis.read_records(run))
            raw = io.BytesIO()
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
                f.write(text.encode())
            write_atomic(target / "metrics.jsonl.gz", raw.getvalue())
            write_atomic(target / wall.name, wall.read_bytes())
    write_atomic(dest / META, json.dumps(meta, indent=1) + "\n")


def write_report(out: Path, dest: Path, meta: dict, table: dict, rows: list[dict]) -> None:
    """`tables.md`, `results.json` and the plots in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    plots = [str(p) for p in report.plots(out, table, NAMES, dest)]
    report.write_json(dest / "results.json", table, rows, meta)
    write_atomic(dest / "tables.md", full_block(rows, table, meta, plots) + "\n")


def _closing_line(meta: dict, took: float, analyse_only: bool, dest: Path) -> str:
    """What this command took, and (when it ran nothing) the wall time the runs it reported
    recorded, named as theirs."""
    line = f"this command took {took:.0f} s"
    if analyse_only:
        line += f"; the reported runs' recorded study wall time: {_wall(meta)}"
    return f"{line}; tables in {dest / 'tables.md'}"


def main(argv: list[str] | None = None) -> int:
    """Run (unless --analyse-only) and report the study; returns the exit code."""
    started = time.perf_counter()
    args = parse(argv)
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS)
    if args.write_docs and args.report is not None and args.report.resolve() != DOCS:
        raise UsageError("--report", "--write-docs writes docs/study", "drop one of the two")
    dest = DOCS if args.write_docs else (args.report or args.out / "report")
    if dest.resolve() == DOCS and not args.write_docs:
        raise UsageError(str(dest), "holds the committed report", "pass --write-docs to replace it")
    if not args.write_docs and dest.resolve().is_relative_to((ROOT / "docs").resolve()):
        where = (
            "--report" if args.report is not None else f"--out {args.out} (report: <out>/report)"
        )
        raise UsageError(
            where,
            f"would write the report into {dest}, inside the committed docs/",
            "pass --report with a folder outside docs/ (e.g. --report /tmp/study), or "
            "--write-docs to regenerate the committed report",
        )
    _check_folder(args.out, "--out")
    _check_folder(dest, "--report")
    meta = read_meta(args.out)
    if not args.analyse_only:
        specs = grid.plan([STUDY_DIR / f"{n}.yaml" for n in NAMES], seeds, args.out,
                          tuple(args.overrides))  # fmt: skip
        for spec in specs:  # refuse a folder the study must not touch before anything runs
            grid.action(spec, args.overwrite)
        t0 = time.perf_counter()
        load = os.getloadavg()[0]
        results = grid.run_all(specs, jobs=args.jobs, overwrite=args.overwrite)
        meta = {
            "seeds": seeds,
            "jobs": args.jobs,
            "study_wall_seconds": time.perf_counter() - t0,
            "load_average_1min": [load, os.getloadavg()[0]],
            "failed": [f"{r.spec.name} seed {r.spec.seed}" for r in results if r.returncode],
            "overrides": args.overrides,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out / META, json.dumps(meta, indent=1) + "\n")
    if args.analyse_only and args.seeds is None:
        seeds = meta.get("seeds", seeds)  # what the runs in --out were run with
    table, rows, meta = blocks(args.out, seeds)
    write_report(args.out, dest, meta, table, rows)
    if args.write_docs:
        if args.out.resolve() != (DOCS / "runs").resolve():
            archive(args.out, DOCS / "runs", meta)
        report.splice(DOCS / "README.md", (dest / "tables.md").read_text())
        report.splice(ROOT / "README.md", headline_block(rows, meta, table))
    print(report.markdown_targets(rows))
    print(_closing_line(meta, time.perf_counter() - started, args.analyse_only, dest))
    return 1 if meta["failed"] else 0


entry = run_main(main)


if __name__ == "__main__":
    entry()
