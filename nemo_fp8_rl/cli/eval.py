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
import time
from pathlib import Path

from nemo_fp8_rl.cli.common import ArgumentParser, int_up_to, positive_int, run_main
from nemo_fp8_rl.config.user_error import UNAVAILABLE, UsageError, UserError
from nemo_fp8_rl.evals.request import check_request, read_run_config
from nemo_fp8_rl.evals.results import EvalResult, write_result

__all__ = ["evaluate_run", "main", "read_run_config"]

DESCRIPTION = """\
Evaluate one checkpoint of a run on a benchmark suite; the result goes to
<run dir>/eval/<suite>.json (and <suite>.<checkpoint>.json). CPU runs are evaluated by the
embedded engine on the addition suite; GPU runs by NeMo RL's checkpoint converter and its
evaluation script on math8 (NeMo RL must be installed here). nemo_fp8_rl.compare puts the
results of evaluated runs beside each other."""
EXAMPLES = ["nemo_fp8_rl.eval --run runs/grpo-tiny-qwen3-cpu-fp8 --checkpoint best"]

# A bound on the work one command line may ask for: pass@k papers sample at most a few hundred
# per problem (`--num-problems` is bounded by the suite's benchmarks).
MAX_SAMPLES = 1024


def with_sampling(suite, samples: int | None, pass_ks: list[int] | None):  # noqa: ANN001, ANN201
    """The suite with `samples` per problem on every benchmark (when given) and its pass@k list
    (default: k = 1), each k checked against every benchmark's samples per problem."""
    from nemo_fp8_rl.evals.passk import check_ks

    if samples is not None:
        benches = tuple(dataclasses.replace(b, samples=samples) for b in suite.benchmarks)
        suite = dataclasses.replace(suite, benchmarks=benches)
    ks = pass_ks or [1]
    for bench in suite.benchmarks:
        try:
            ks = check_ks(ks, bench.samples, f"--pass-k on {bench.name}")
        except ValueError as exc:
            raise UsageError(
                f"--pass-k {','.join(map(str, pass_ks or [1]))}",
                str(exc).split(": ", 1)[1].split("; ")[0],
                f"pass --samples {max(ks)} (or more), or drop the k above {bench.samples}",
            ) from None
    return dataclasses.replace(suite, pass_ks=tuple(ks))


def evaluate_run(
    run_dir: Path,
    checkpoint: str = "last",
    suite_name: str | None = None,
    data_dir: Path | None = None,
    num_problems: int | None = None,
    samples: int | None = None,
    pass_ks: list[int] | None = None,
) -> Path:
    """Check every argument (`evals.request`), then evaluate and write; returns the result file."""
    from nemo_fp8_rl.analysis.recipe_diff import precision_of

    request = check_request(run_dir, checkpoint, suite_name, data_dir)
    config, engine, suite, selection = (
        request.config,
        request.engine,
        request.suite,
        request.selection,
    )
    if num_problems is not None:
        if engine != "local":
            raise UsageError(
                f"--num-problems {num_problems}",
                f"sets the size of the CPU suite; {suite.name} has fixed benchmarks",
                "leave --num-problems out",
            )
        suite = dataclasses.replace(suite, num_problems=num_problems)
    suite = with_sampling(suite, samples, pass_ks)
    t0 = time.perf_counter()
    missing: dict[str, str] = {}
    print(f"evaluating {run_dir.name} {selection.selector} (step {selection.step}) on {suite.name}")
    _print_best_note(run_dir, selection)
    if engine == "local":
        from nemo_fp8_rl.evals import local

        scores, sampling = local.evaluate(run_dir, config, selection, suite)
    else:
        from nemo_fp8_rl.evals import nemo

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
    for name, b in scores.items():
        if b.correct is not None:
            shown = ", ".join(f"pass@{k} {v:.3f}" for k, v in b.to_json()["pass_at_k"].items())
            print(f"  {name}: {shown} (n={b.samples_per_problem} samples x {b.num_problems})")
    for name, why in missing.items():
        print(f"  missing {name}: {why}")
    return path


def _print_best_note(run_dir: Path, selection) -> None:
    from nemo_fp8_rl.evals.checkpoints import best_note

    note = best_note(run_dir, selection)
    if note:
        print(f"  {note}")


def dry_run(run_dir: Path, checkpoint: str, suite_name: str | None, data_dir: Path | None) -> int:
    """Check every argument as a real evaluation does and print what it would do; exit code 3
    when the engine the run needs is not usable here (a GPU run without NeMo RL), as `train`."""
    request = check_request(run_dir, checkpoint, suite_name, data_dir)
    selection, suite = request.selection, request.suite
    print(
        f"would evaluate {run_dir} {selection.selector} (step {selection.step}) on {suite.name} "
        f"({', '.join(b.name for b in suite.benchmarks)}) with the {request.engine} engine, "
        f"writing {run_dir / 'eval' / (suite.name + '.json')}"
    )
    _print_best_note(run_dir, selection)
    if request.engine == "nemo":
        from nemo_fp8_rl.engines.nemo.driver.compat import available

        usable, why = available()
        if not usable:
            raise UserError(
                "nemo_fp8_rl.eval",
                f"NeMo RL is not usable here: {why}",
                "run in NeMo RL's environment (scripts/nemo-rl-env.sh builds one)",
                code=UNAVAILABLE,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and evaluate; returns the exit code."""
    p = ArgumentParser(prog="nemo_fp8_rl.eval", description=DESCRIPTION, examples=EXAMPLES)
    p.add_argument("--run", type=Path, required=True, help="run directory, e.g. runs/<name>")
    p.add_argument("--checkpoint", default="last", help="last (default), best or step_N")
    p.add_argument("--suite", default=None, help="math8 (GPU runs) or addition (CPU runs)")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="JSONL files for benchmarks NeMo RL lacks"
    )
    p.add_argument(
        "--num-problems",
        type=positive_int,  # bounded by the suite's benchmarks (more is refused)
        default=None,
        help="CPU suite: problems per benchmark (256)",
    )
    p.add_argument(
        "--samples",
        type=int_up_to(MAX_SAMPLES),
        default=None,
        help="samples per problem on every benchmark (default: the suite's, 4 or 16)",
    )
    p.add_argument(
        "--pass-k",
        type=_ks,
        default=None,
        metavar="K[,K...]",
        help="report the unbiased pass@k for each K <= samples per problem (default 1)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the run, checkpoint, suite and --data-dir and say what would be evaluated",
    )
    args = p.parse_args(argv)
    if args.dry_run:
        return dry_run(args.run, args.checkpoint, args.suite, args.data_dir)
    # a bad argument or run (UsageError, exit code 2) or NeMo RL's tools failing or missing
    # (NemoEvalError, 1) is reported by `invoke`
    evaluate_run(
        args.run,
        args.checkpoint,
        args.suite,
        args.data_dir,
        args.num_problems,
        args.samples,
        args.pass_k,
    )
    return 0


def _ks(text: str) -> list[int]:
    """`1,4,16` -> [1, 4, 16] (positive integers)."""
    try:
        ks = [int(t) for t in text.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected k values such as 1,4,16")
    return ks


entry = run_main(main)

if __name__ == "__main__":
    entry()
