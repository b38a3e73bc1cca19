"""`python -m nemo_fp8_rl.study [--seeds 1 2 3] [--jobs 2] [--out runs/study] [--report docs/study]`.

Runs the three study recipes over the seeds (kept runs are reused; `--analyse-only` skips
running), then writes `<report>/README.md`, `<report>/results.json` and the plots.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.study import analysis, grid, report

STUDY_DIR = Path(__file__).resolve().parents[2] / "recipes" / "study"
ROLES = {
    "bf16": "grpo-study-bf16",
    "fp8_uncal": "grpo-study-fp8-uncalibrated",
    "fp8_cal": "grpo-study-fp8",
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="nemo_fp8_rl.study", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--out", type=Path, default=Path("runs/study"))
    ap.add_argument("--report", type=Path, default=Path("docs/study"))
    ap.add_argument("--analyse-only", action="store_true", help="only write the report")
    ap.add_argument(
        "overrides", nargs="*", help="key=value overrides for every run (quick checks only)"
    )
    return ap.parse_args(argv)


def settings(names: list[str]) -> str:
    """The study recipes' differences from the tiny default, as a Markdown list."""
    lines = []
    for name in names:
        recipe = load_recipe(STUDY_DIR / f"{name}.yaml")
        cfg = recipe.config
        meg, pol = cfg["policy"]["megatron_cfg"], cfg["policy"]
        fp8 = meg["fp8_cfg"]
        cal = cfg["loss_fn"]["calibration"]
        lines.append(
            f"- `{name}`: FP8 training {'on, ' + fp8['fp8_recipe'] if fp8['enabled'] else 'off'}, "
            f"rollout {pol['generation']['vllm_cfg']['precision']}, "
            f"calibration {'on (every ' + str(cal['interval']) + ' steps)' if cal['enabled'] else 'off'}, "
            f"{cfg['grpo']['max_num_steps']} steps of {cfg['grpo']['num_prompts_per_step']}×"
            f"{cfg['grpo']['num_generations_per_prompt']} samples, "
            f"{cfg['grpo']['num_prompts_per_step'] * cfg['grpo']['num_generations_per_prompt'] // pol['train_global_batch_size']} "
            f"updates per batch, micro batch {pol['train_micro_batch_size']}, logprob batch "
            f"{pol['logprob_batch_size']}, lr {meg['optimizer']['lr']}, "
            f"model {cfg['local']['model']['num_layers']} layers × {cfg['local']['model']['hidden_size']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    names = [ROLES["bf16"], ROLES["fp8_uncal"], ROLES["fp8_cal"]]
    t0 = time.perf_counter()
    results = []
    if not args.analyse_only:
        specs = grid.plan(
            [STUDY_DIR / f"{n}.yaml" for n in names], args.seeds, args.out, tuple(args.overrides)
        )
        results = grid.run_all(specs, jobs=args.jobs)
    wall = time.perf_counter() - t0
    table = analysis.collect(args.out, names, args.seeds)
    rows = report.targets(table, ROLES)
    plot_paths = report.plots(args.out, table, names, args.report)
    meta = {
        "seeds": args.seeds,
        "jobs": args.jobs,
        "study_wall_seconds": wall if results else None,
        "failed": [f"{r.spec.name} seed {r.spec.seed}" for r in results if r.returncode],
        "overrides": args.overrides,
    }
    args.report.mkdir(parents=True, exist_ok=True)
    report.write_json(args.report / "results.json", table, rows, meta)
    (args.report / "tables.md").write_text(
        "\n\n".join(
            [
                report.markdown_targets(rows),
                report.markdown_summary(table, names),
                report.markdown_per_seed(table, names),
                settings(names),
                "Plots: " + ", ".join(p.name for p in plot_paths),
            ]
        )
        + "\n"
    )
    print(report.markdown_targets(rows))
    print(f"study wall time {wall:.0f} s; tables in {args.report / 'tables.md'}")
    return 1 if meta["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
