"""The evaluation result file, `runs/<name>/eval/<suite>.json` (both engines write the same format).

```
{"format": 1, "suite": "math8", "run": "<run name>", "recipe": "<recipe name>", "seed": 42,
 "precision": "bf16" | "fp8", "engine": "local" | "nemo",
 "checkpoint": {"selector", "step", "path", "metric", "value", "candidates", "selection_bias", ...},
 "sampling": {"temperature", "top_p", "top_k", "max_new_tokens"},
 "benchmarks": {"<name>": {"title", "score", "num_problems", "samples_per_problem", "metric",
                           "dataset", "pass_at_k": {"<k>": ...}, "correct_per_problem": [...]}},
 "average": <mean of the benchmark scores>, "missing": {"<name>": "<why>"}, "seconds": ...}
```

`score` is avg@n in [0, 1]; `pass_at_k` the unbiased pass@k for each k asked (`evals.passk`),
and `correct_per_problem` the correct samples of each problem, in the benchmark's fixed order; `average` is the unweighted mean over the benchmarks evaluated (the
study's "average over eight benchmarks"); a suite with missing benchmarks says so in `missing`.
A second evaluation of another checkpoint goes to `<suite>.<selector>.json` as well, so `last`
and `best` can sit side by side (`<suite>.json` is always the latest one written).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import read_text_bounded, write_atomic
from nemo_fp8_rl.config.user_error import UsageError, UserError
from nemo_fp8_rl.evals.passk import pass_at_k

FORMAT = 1


@dataclass
class BenchmarkScore:
    """One benchmark's result; `correct` holds, per problem in a fixed order, how many of its
    samples were correct (for pass@k and per-question pairing, `evals.passk`)."""

    title: str
    score: float
    num_problems: int
    samples_per_problem: int
    dataset: str
    correct: list[int] | None = None
    pass_ks: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The benchmark's entry."""
        out = {
            "title": self.title,
            "score": self.score,
            "num_problems": self.num_problems,
            "samples_per_problem": self.samples_per_problem,
            "metric": f"avg@{self.samples_per_problem}",
            "dataset": self.dataset,
        }
        if self.correct is not None:
            n = self.samples_per_problem
            out["pass_at_k"] = {str(k): pass_at_k(self.correct, n, k) for k in self.pass_ks}
            out["correct_per_problem"] = list(self.correct)
        return out


@dataclass
class EvalResult:
    """Everything one evaluation produced (see the module docstring for the file)."""

    suite: str
    run: str
    recipe: str
    seed: int | None
    precision: str
    engine: str
    checkpoint: dict[str, Any]
    sampling: dict[str, Any]
    benchmarks: dict[str, BenchmarkScore]
    missing: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def average(self) -> float:
        """Unweighted mean of the benchmark scores (NaN when none was evaluated)."""
        scores = [b.score for b in self.benchmarks.values()]
        return sum(scores) / len(scores) if scores else math.nan

    def to_json(self) -> dict[str, Any]:
        """The file's content."""
        return {
            "format": FORMAT,
            "suite": self.suite,
            "run": self.run,
            "recipe": self.recipe,
            "seed": self.seed,
            "precision": self.precision,
            "engine": self.engine,
            "checkpoint": self.checkpoint,
            "sampling": self.sampling,
            "benchmarks": {k: v.to_json() for k, v in self.benchmarks.items()},
            "average": None if math.isnan(self.average) else self.average,
            "missing": self.missing,
            "seconds": self.seconds,
        }


def write_result(result: EvalResult, run_dir: Path) -> Path:
    """Write `eval/<suite>.json` and `eval/<suite>.<selector>.json` atomically; returns the first."""
    out = run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result.to_json(), indent=1)
    selector = result.checkpoint["selector"]
    paths = [out / f"{result.suite}.json", out / f"{result.suite}.{selector}.json"]
    for path in paths:
        write_atomic(path, text + "\n")
    return paths[0]


MAX_RESULT_BYTES = 64 * 2**20  # a result holds scores and per-benchmark counts: kilobytes


class EvalReadError(UsageError):
    """An evaluation file is unreadable or malformed; the message names it (exit code 2)."""


_REREAD = "re-run nemo_fp8_rl.eval for this checkpoint, or move the file out of eval/"


def read_result(path: Path) -> dict[str, Any]:
    """Load and check one result file (the dict as written): an object with `suite`, `run`,
    `checkpoint` (`selector`, `step`) and `benchmarks` (name -> object with a numeric `score`)."""
    try:  # a regular file of at most MAX_RESULT_BYTES: a named pipe there would block the read
        data = json.loads(read_text_bounded(Path(path), MAX_RESULT_BYTES, "result file"))
    except UserError as exc:
        raise EvalReadError(path, exc.what, _REREAD) from None
    except (OSError, ValueError) as exc:
        raise EvalReadError(path, f"cannot read an evaluation result ({exc})", _REREAD) from None
    if not isinstance(data, dict):
        what = f"a JSON {type(data).__name__}, not an object"
        raise EvalReadError(path, f"not an evaluation result ({what})", _REREAD)
    for key in ("suite", "run", "checkpoint", "benchmarks"):
        if key not in data:
            raise EvalReadError(path, f"not an evaluation result (no {key!r})", _REREAD)
    checkpoint, benchmarks = data["checkpoint"], data["benchmarks"]
    if not isinstance(checkpoint, dict) or not {"selector", "step"} <= checkpoint.keys():
        raise EvalReadError(path, "checkpoint: expected an object with selector and step", _REREAD)
    scores_ok = isinstance(benchmarks, dict) and all(
        isinstance(b, dict) and isinstance(b.get("score"), int | float) for b in benchmarks.values()
    )
    if not scores_ok:
        raise EvalReadError(path, "benchmarks: expected name -> {score, ...}", _REREAD)
    for name, bench in benchmarks.items():  # a score is a share of problems solved
        score = bench["score"]
        if isinstance(score, bool) or not (math.isfinite(score) and 0 <= score <= 1):
            raise EvalReadError(
                path, f"benchmarks.{name}.score is {score!r}, not a share in [0, 1]", _REREAD
            )
    return data


def run_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every `<suite>.<selector>.json` of a run (one per suite and checkpoint selector)."""
    folder = Path(run_dir) / "eval"
    files = sorted(p for p in folder.glob("*.*.json")) if folder.is_dir() else []
    return [read_result(p) for p in files]
