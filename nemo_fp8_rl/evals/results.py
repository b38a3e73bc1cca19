"""The evaluation result file, `runs/<name>/eval/<suite>.json` (both engines write the same format).

```
{"format": 1, "suite": "math8", "run": "<run name>", "recipe": "<recipe name>", "seed": 42,
 "precision": "bf16" | "fp8", "engine": "local" | "nemo",
 "checkpoint": {"selector", "step", "path", "metric", "value", "candidates", "selection_bias", ...},
 "sampling": {"temperature", "top_p", "top_k", "max_new_tokens"},
 "benchmarks": {"<name>": {"title", "score", "num_problems", "samples_per_problem", "metric",
                           "dataset"}},
 "average": <mean of the benchmark scores>, "missing": {"<name>": "<why>"}, "seconds": ...}
```

`score` is avg@n in [0, 1]; `average` is the unweighted mean over the benchmarks evaluated (the
study's "average over eight benchmarks"); a suite with missing benchmarks says so in `missing`.
A second evaluation of another checkpoint goes to `<suite>.<selector>.json` as well, so `last`
and `best` can sit side by side (`<suite>.json` is always the latest one written).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1


@dataclass
class BenchmarkScore:
    """One benchmark's result."""

    title: str
    score: float
    num_problems: int
    samples_per_problem: int
    dataset: str

    def to_json(self) -> dict[str, Any]:
        """The benchmark's entry."""
        return {
            "title": self.title,
            "score": self.score,
            "num_problems": self.num_problems,
            "samples_per_problem": self.samples_per_problem,
            "metric": f"avg@{self.samples_per_problem}",
            "dataset": self.dataset,
        }


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
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return paths[0]


class EvalReadError(ValueError):
    """An evaluation file is missing or malformed; the message names it."""


def read_result(path: Path) -> dict[str, Any]:
    """Load and check one result file (the dict as written)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalReadError(f"{path}: cannot read an evaluation result ({exc})") from None
    for key in ("suite", "run", "checkpoint", "benchmarks"):
        if key not in data:
            raise EvalReadError(f"{path}: not an evaluation result (no {key!r}); re-run eval")
    return data


def run_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every `<suite>.<selector>.json` of a run (one per suite and checkpoint selector)."""
    folder = Path(run_dir) / "eval"
    files = sorted(p for p in folder.glob("*.*.json")) if folder.is_dir() else []
    return [read_result(p) for p in files]
