"""`nemo_fp8_rl.compare A B [C ...] [key=value ...]`: compare recipes, or compare runs.

- Recipes (paths or short names such as `tiny/grpo-tiny-qwen3-cpu-fp8`): the resolved diff,
  grouped precision / refit / calibration / other, with a warning when a pair differs outside
  the precision groups. Trailing `dotted.key=value` overrides apply to every recipe.
- Runs (run directories, NeMo RL log directories, `metrics.jsonl` or event files): a summary
  table and one verdict per FP8 run in the terminal, plus `report.md`, `report.html` and PNG
  plots in `--out` (default `results/compare-<name>-vs-<name>...-<hash of the inputs>`, one
  folder per comparison; `inputs.json` there records what it holds, and a folder holding
  another comparison or files compare did not write is refused unless `--overwrite`).
- Runs of one recipe over several seeds (`runs/<name>/seed-<k>`, from `train --seeds`; give the
  recipe's folder `runs/<name>` or the seed folders themselves): grouped by recipe, with mean and
  95 % Student-t interval per metric (n beside it), differences paired by seed, verdicts that say "within
  noise", and band plots (`nemo_fp8_rl.analysis.groups`, `nemo_fp8_rl.analysis.report_groups`); the per-run
  report of every seed goes to `--out/runs/`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

from nemo_fp8_rl.cli.common import ArgumentParser, run_main
from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UsageError

_RUN_FILES = ("metrics.jsonl",)
DESCRIPTION = """\
Compare recipes, or compare runs.

Recipes (paths or short names): the resolved difference, grouped as precision, refit,
calibration and other, with a warning when a pair differs outside the precision groups.
Trailing key=value overrides apply to every recipe.

Runs (run folders, NeMo RL log folders, metrics.jsonl or event files): a summary table and
one verdict per FP8 run, and in the report folder report.md, report.html, PNG plots and
verdict.json (the verdicts for scripts: outcome match, within_noise, higher, lower or
not_comparable per run, and ok). The default folder is results/compare-<names>-<hash of the
inputs>; a folder holding another comparison, or files compare did not write, is refused
unless --overwrite.

Runs of one recipe over several seeds (runs/<name>/seed-<k>, from train --seeds; give the
recipe's folder or the seed folders): grouped by recipe, with the mean and 95 % Student-t
interval per metric, differences paired by seed, verdicts that say within noise, and band
plots; the report of every single run goes to <report folder>/runs/."""
EXAMPLES = ["nemo_fp8_rl.compare runs/grpo-tiny-qwen3-cpu-bf16 runs/grpo-tiny-qwen3-cpu-fp8 --json"]


def _kind(item: str) -> str:
    """ "run" (a directory, a metrics JSONL or an event file), "recipe", or "unknown"."""
    path = Path(item)
    if path.is_dir() or (
        path.is_file() and (path.name in _RUN_FILES or path.name.startswith("events.out.tfevents."))
    ):
        return "run"
    from nemo_fp8_rl.config import RecipeError, resolve_ref

    try:
        resolve_ref(item)
    except RecipeError:
        return "unknown"
    return "recipe"


def _split(items: list[str]) -> tuple[list[str], list[str]]:
    """Separate trailing `key=value` overrides from the things to compare."""
    targets = [i for i in items if "=" not in i or Path(i).exists()]
    overrides = [i for i in items if i not in targets]
    return targets, overrides


def _unique_names(paths: list[Path]) -> list[str]:
    """Run names: the directory name, with its parent prepended where two would collide."""
    names = [p.name if p.is_dir() else p.parent.name for p in paths]
    return [
        f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n
        for p, n in zip(paths, names, strict=True)
    ]


def _check_inputs(targets: list[str], out: Path | None, is_runs: bool) -> None:
    """Refuse a run compared with itself, or an `--out` that is a file (`UsageError`)."""
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}", "is a file, not a folder", "give a folder for the report")
    if is_runs:
        seen: dict[Path, str] = {}
        for t in targets:
            key = Path(t).resolve()
            key = key.parent if key.is_file() else key
            if key in seen:
                raise UsageError(
                    t,
                    f"is the same run as {seen[key]}, and a run always matches itself",
                    "compare two different runs (e.g. a BF16 and an FP8 run)",
                )
            seen[key] = t


def compare_recipes(
    refs: list[str], overrides: list[str], out: Path | None, overwrite: bool = False
) -> int:
    """Load each recipe (with the overrides) and print the grouped diff and any fairness warning."""
    from nemo_fp8_rl.analysis.recipe_diff import diff_configs
    from nemo_fp8_rl.analysis.report import print_diff, render_diff_markdown
    from nemo_fp8_rl.analysis.report_folder import claim
    from nemo_fp8_rl.config import load_recipe, short_name

    recipes = [load_recipe(ref, overrides) for ref in refs]
    diff = diff_configs([short_name(r.path) for r in recipes], [r.config for r in recipes])
    folder = None
    if out is not None:  # claimed before anything is printed or written
        inputs = [str(Path(r.path).resolve()) for r in recipes] + list(overrides)
        folder = claim(out, "recipes", inputs, overwrite=overwrite)
    print_diff(diff)
    if folder is not None:
        write_atomic(out / "recipes.md", "\n".join(render_diff_markdown(diff)))
        folder.record()
        print(f"wrote {out / 'recipes.md'}")
    return 0


def expand_seed_groups(items: list[str]) -> list[Path]:
    """Each item as a run path; a recipe folder holding `seed-<k>` runs (and no metrics of its
    own) stands for those runs, in seed order."""
    from nemo_fp8_rl.runs.seeds import seed_dirs

    paths: list[Path] = []
    for item in items:
        path = Path(item)
        seeds = seed_dirs(path) if path.is_dir() and not (path / "metrics.jsonl").exists() else []
        paths += seeds or [path]
    return paths


def compare_run_dirs(
    items: list[str],
    out: Path | None,
    plots: bool,
    tolerance: float,
    overwrite: bool = False,
    allow_unfair: bool = False,
) -> dict:
    """Read the runs and their evaluations, refuse runs that differ in more than precision and
    seed unless `allow_unfair` labels their verdicts (`analysis.fairness`), claim the report
    folder (`report_folder`), print the table and verdicts, write the report files and
    `verdict.json`; returns the verdict."""
    from nemo_fp8_rl.analysis import fairness
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.groups import ONE_RUN, compare_groups, group_runs
    from nemo_fp8_rl.analysis.more_seeds import more_seeds_commands
    from nemo_fp8_rl.analysis.report import print_comparison, write_report
    from nemo_fp8_rl.analysis.report_folder import claim, default_folder, input_path
    from nemo_fp8_rl.analysis.rundata import load_run
    from nemo_fp8_rl.analysis.verdict_json import groups_verdict, runs_verdict, write_verdict
    from nemo_fp8_rl.evals import table

    start = time.perf_counter()
    paths = expand_seed_groups(items)
    runs = [load_run(p, name) for p, name in zip(paths, _unique_names(paths), strict=True)]
    labels = fairness.check(runs, allow_unfair)  # before anything is written
    evaluations = table.collect([p if p.is_dir() else p.parent for p in paths])
    recipes = group_runs(runs)  # runs of one recipe only: compared run by run
    grouped = len(recipes) >= 2 and any(len(g.runs) > 1 for g in recipes)
    names = [g.name for g in recipes] if grouped else [r.name for r in runs]
    inputs = [input_path(i) for i in items]
    out = out or default_folder(names, inputs, "runs")
    folder = claim(
        out, "runs", inputs, [input_path(p) for p in paths], overwrite, keep_plots=not plots
    )
    if grouped:
        groups = compare_groups(runs, tolerance_points=tolerance)
        about = [
            [r.name for r in g.runs] for i, g in enumerate(groups.groups) if i != groups.reference
        ]
        groups.verdicts = fairness.labelled(groups.verdicts, about, labels)
        _write_grouped(groups, runs, out, plots, tolerance)
        verdict = groups_verdict(groups, tolerance)
    else:
        comparison = compare_runs(runs, tolerance_points=tolerance)
        about = [
            [s.name]
            for i, s in enumerate(comparison.summaries)
            if i != comparison.reference and s.precision != "bf16"
        ]
        comparison.verdicts = fairness.labelled(comparison.verdicts, about, labels)
        if len(recipes) >= 2:
            comparison.verdicts = [f"{v}; this {ONE_RUN}" for v in comparison.verdicts]
        print_comparison(comparison)
        if len(recipes) >= 2:
            print("more seeds of each recipe (the verdict then gets intervals):")
            names, firsts = [g.name for g in recipes], [g.runs[0] for g in recipes]
            print("\n".join(f"  {c}" for c in more_seeds_commands(names, firsts)))
        files = write_report(comparison, out, plots=plots)
        print(f"wrote {files.markdown} and {files.html} ({len(files.plots)} plots)")
        verdict = runs_verdict(comparison, tolerance)
    verdict["fair"] = not any(v.startswith("NOT A PRECISION") for v in labels.values())
    verdict["fairness_labels"] = labels
    print(f"wrote {write_verdict(verdict, out)}")
    write_evaluations(evaluations, out)
    folder.record()
    print(f"done in {time.perf_counter() - start:.2f} s; {out / 'inputs.json'} records the inputs")
    return verdict


def write_evaluations(tables: list, out: Path) -> None:
    """Benchmark tables (BF16 vs each FP8 arm, last and best) when the runs were evaluated."""
    from nemo_fp8_rl.evals import table

    if not tables:
        from nemo_fp8_rl.config.commands import command

        print(f"no evaluations (runs/<name>/eval/*.json): run {command('eval')} --run <run> first")
        return
    table.print_tables(tables)
    write_atomic(out / "evaluation.md", table.markdown(tables))
    add_to_reports(out, table.markdown(tables), table.html(tables))
    print(f"wrote {out / 'evaluation.md'} (also in report.md and report.html)")


def add_to_reports(out: Path, markdown: str, html: str) -> None:
    """Append a section to `out/report.md` and insert it at the end of `out/report.html`."""
    md, page = out / "report.md", out / "report.html"
    if md.is_file():
        write_atomic(md, md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + markdown)
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        head, tag, tail = text.rpartition("</body>")
        write_atomic(page, head + html + "\n" + tag + tail if tag else text + html)


def _write_grouped(groups, runs, out: Path, plots: bool, tolerance: float) -> None:
    """Grouped runs: the interval table and verdicts; report in `out`, per-run report in `out/runs`."""
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.report import write_report
    from nemo_fp8_rl.analysis.report_groups import print_groups
    from nemo_fp8_rl.analysis.report_groups import write_report as write_group_report

    print_groups(groups)
    write_report(compare_runs(runs, tolerance_points=tolerance), out / "runs", plots=False)
    md, page, pngs = write_group_report(groups, out, plots=plots, runs_report="runs/report.md")
    print(f"wrote {md} and {page} ({len(pngs)} plots)")


def _tolerance(text: str) -> float:
    """`--tolerance-points`: a finite number of points, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and compare recipes or runs; returns the exit code."""
    from nemo_fp8_rl.analysis.compare import DEFAULT_TOLERANCE_POINTS

    parser = ArgumentParser(prog="nemo_fp8_rl.compare", description=DESCRIPTION, examples=EXAMPLES)
    parser.add_argument(
        "items",
        nargs="+",
        metavar="RUN|RECIPE|key=value",
        help="two or more runs or recipes, then overrides (recipes only)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default: named after the inputs)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an --out folder that holds another comparison or other files",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="runs: print the verdicts as JSON on stdout (the table goes to stderr); "
        "verdict.json beside report.md holds the same either way",
    )
    parser.add_argument(
        "--tolerance-points",
        type=_tolerance,
        default=DEFAULT_TOLERANCE_POINTS,
        help="accuracy gap (points) still called a match",
    )
    parser.add_argument(
        "--allow-unfair",
        action="store_true",
        help="runs that differ in more than precision and seed (engine, generator, NeMo RL "
        "tree, recipe keys): compare them anyway, each verdict labelled as not a precision "
        "comparison (without it, compare refuses them)",
    )
    args = parser.parse_args(argv)
    targets, overrides = _split(args.items)
    if len(targets) < 2 and len(expand_seed_groups(targets)) < 2:  # one folder of seeds is fine
        parser.error(f"give two or more runs or recipes to compare, got {len(targets)}: {targets}")
    kinds = {t: _kind(t) for t in targets}
    unknown = [t for t, k in kinds.items() if k == "unknown"]
    if unknown:
        from nemo_fp8_rl.config.locations import closest_names

        close = closest_names(unknown[0])
        hint = f"did you mean the recipe {' or '.join(close)}? Else c" if close else "C"
        raise UsageError(
            ", ".join(unknown),
            "neither a run (no such directory or metrics file) nor a recipe",
            f"{hint}heck the path, or pick a recipe from `nemo_fp8_rl.recipes list`",
        )
    if len(set(kinds.values())) > 1:
        runs = [t for t, k in kinds.items() if k == "run"]
        recipes = [t for t, k in kinds.items() if k == "recipe"]
        parser.error(f"give either runs or recipes, not both (runs: {runs}; recipes: {recipes})")
    is_runs = set(kinds.values()) == {"run"}
    if args.json and not is_runs:
        parser.error("--json goes with runs; recipes are compared as a diff")
    if is_runs and overrides:
        parser.error(f"overrides apply to recipes only; a run's recipe is fixed (got {overrides})")
    _check_inputs(targets, args.out, is_runs)
    if not is_runs:
        return compare_recipes(targets, overrides, args.out, args.overwrite)
    plots = not args.no_plots
    human = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with human:
        verdict = compare_run_dirs(
            targets, args.out, plots, args.tolerance_points, args.overwrite, args.allow_unfair
        )
    if args.json:
        from nemo_fp8_rl.analysis.verdict_json import dumps

        sys.stdout.write(dumps(verdict))
    return 0


entry = run_main(main)


if __name__ == "__main__":
    entry()
