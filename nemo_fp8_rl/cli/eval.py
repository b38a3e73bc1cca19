"""`nemo_fp8_rl.eval --run runs/<name> [--checkpoint last|best|step_N] [--suite S] [--data-dir D]`.

Evaluates one checkpoint of a finished (or running) run on a benchmark suite and writes
`runs/<name>/eval/<suite>.json` (and `<suite>.<checkpoint>.json`). CPU runs
(`cluster.gpus_per_node: 0`) are evaluated by the embedded engine on the `addition` suite; GPU runs
by NeMo RL's checkpoint converter and `examples/run_eval.py` on `math8` (see
`nemo_fp8_rl.evals.suites` for the benchmarks, the sampling and what NeMo RL lacks).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.cli.common import run_main
from nemo_fp8_rl.evals.checkpoints import CheckpointError, select_local, select_nemo
from nemo_fp8_rl.evals.results import EvalResult, write_result
from nemo_fp8_rl.evals.suites import SuiteError, get_suite


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved recipe (`recipe.yaml`, written by both engines when the run starts)."""
    path = run_dir / "recipe.yaml"
    if not path.is_file():
        raise CheckpointError(
            f"{path} not found: {run_dir} is not a run directory (nemo_fp8_rl.train writes it)"
        )
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def evaluate_run(
    run_dir: Path,
    checkpoint: str = "last",
    suite_name: str | None = None,
    data_dir: Path | None = None,
    num_problems: int | None = None,
) -> Path:
    """Select, evaluate, write; returns the result file."""
    from nemo_fp8_rl.analysis.compare import precision_of

    config = read_run_config(run_dir)
    engine = "local" if config["cluster"]["gpus_per_node"] == 0 else "nemo"
    suite = get_suite(suite_name, engine)
    if num_problems is not None and engine == "local":
        suite = dataclasses.replace(suite, num_problems=num_problems)
    t0 = time.perf_counter()
    missing: dict[str, str] = {}
    if engine == "local":
        from nemo_fp8_rl.evals import local

        selection = select_local(run_dir, checkpoint)
        print(
            f"evaluating {run_dir.name} {selection.selector} (step {selection.step}) on {suite.name}"
        )
        scores, sampling = local.evaluate(run_dir, config, selection, suite)
    else:
        from nemo_fp8_rl.evals import nemo

        selection = select_nemo(run_dir, checkpoint, config["checkpointing"])
        print(
            f"evaluating {run_dir.name} {selection.selector} (step {selection.step}) on {suite.name}"
        )
        scores, sampling, missing = nemo.evaluate(run_dir, config, selection, suite, data_dir)
    result = EvalResult(
        suite=suite.name,
        run=run_dir.name,
        recipe=str(config["logger"]["wandb"].get("name") or run_dir.name),
        seed=config["grpo"].get("seed"),
        precision=precision_of(config),
        engine=engine,
        checkpoint=selection.to_json(),
        sampling=sampling,
        benchmarks=scores,
        missing=missing,
        seconds=time.perf_counter() - t0,
    )
    path = write_result(result, run_dir)
    print(
        f"{suite.name} average {result.average:.3f} over {len(scores)} benchmark(s); wrote {path}"
    )
    for name, why in missing.items():
        print(f"  missing {name}: {why}")
    return path


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and evaluate; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="nemo_fp8_rl.eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", type=Path, required=True, help="run directory, e.g. runs/<name>")
    p.add_argument("--checkpoint", default="last", help="last (default), best or step_N")
    p.add_argument("--suite", default=None, help="math8 (GPU runs) or addition (CPU runs)")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="JSONL files for benchmarks NeMo RL lacks"
    )
    p.add_argument(
        "--num-problems", type=int, default=None, help="CPU suite: problems per benchmark (256)"
    )
    args = p.parse_args(argv)
    try:
        evaluate_run(args.run, args.checkpoint, args.suite, args.data_dir, args.num_problems)
    except (CheckpointError, SuiteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # NemoEvalError: NeMo RL's tools failed or are missing
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


entry = run_main(main)

if __name__ == "__main__":
    entry()
