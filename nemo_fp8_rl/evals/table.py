"""Evaluation tables for `compare`: per benchmark and average, BF16 vs each FP8 arm, last and best.

Runs of the same recipe (different `grpo.seed`) are one *arm*; its value on a benchmark is the
mean over its seeds, and with two or more seeds the table shows a 95 % Student-t interval over
seeds with n beside it (`nemo_fp8_rl.analysis.stats`). Each FP8 arm also gets its difference to
the BF16 arm on the average: the t-interval of the per-seed differences where the same seeds
ran, Welch's interval otherwise. With one seed per arm the table says so: a single run is no
evidence of a difference.

Columns come in pairs, last checkpoint and best-by-validation. The best checkpoint is the
maximum of noisy validation scores, so its numbers are biased upward (see
`nemo_fp8_rl.evals.checkpoints`); the study's published numbers are best-checkpoint numbers of
single runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.evals.results import run_results

SELECTORS = ("last", "best")
SELECTION_BIAS = (
    "best = the checkpoint with the highest validation score: the maximum of noisy scores is "
    "biased upward (most on benchmarks that are also the validation set), so compare last with "
    "last; best rows are what single-run, best-checkpoint studies report."
)


@dataclass
class Arm:
    """One recipe's evaluations: per selector, per benchmark (and "average"), one value per seed."""

    recipe: str
    precision: str
    seeds: dict[str, list[int | None]] = field(default_factory=lambda: defaultdict(list))
    values: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    steps: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # selector -> benchmark -> k -> pass@k per seed
    passk: dict[str, dict[str, dict[str, list[float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    )
    # selector -> benchmark -> (correct per problem, samples per problem) per seed
    questions: dict[str, dict[str, list[tuple[list[int], int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )


@dataclass
class EvalTable:
    """One suite across arms."""

    suite: str
    benchmarks: list[str]
    arms: list[Arm]
    missing: dict[str, str]
    reference: int


def collect(run_dirs: Sequence[Path]) -> list[EvalTable]:
    """Every suite any of the runs was evaluated on (runs without evaluations are skipped)."""
    by_suite: dict[str, dict[str, Arm]] = defaultdict(dict)
    order: dict[str, list[str]] = defaultdict(list)
    missing: dict[str, dict[str, str]] = defaultdict(dict)
    for run_dir in run_dirs:
        for r in run_results(Path(run_dir)):
            arm = by_suite[r["suite"]].setdefault(
                r["recipe"], Arm(r["recipe"], r.get("precision", "?"))
            )
            sel = r["checkpoint"]["selector"] if r["checkpoint"]["selector"] in SELECTORS else None
            if sel is None:
                continue
            arm.seeds[sel].append(r.get("seed"))
            arm.steps[sel].append(r["checkpoint"]["step"])
            for name, b in r["benchmarks"].items():
                arm.values[sel][name].append(b["score"])
                for k, v in (b.get("pass_at_k") or {}).items():
                    arm.passk[sel][name][k].append(v)
                if b.get("correct_per_problem") is not None:
                    arm.questions[sel][name].append(
                        (b["correct_per_problem"], b["samples_per_problem"])
                    )
                if name not in order[r["suite"]]:
                    order[r["suite"]].append(name)
            if r.get("average") is not None:
                arm.values[sel]["average"].append(r["average"])
            missing[r["suite"]].update(r.get("missing") or {})
    tables = []
    for suite, arms in by_suite.items():
        listed = list(arms.values())
        ref = next((i for i, a in enumerate(listed) if a.precision == "bf16"), 0)
        tables.append(EvalTable(suite, order[suite], listed, missing[suite], ref))
    return tables


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    ci = stats.mean_interval(values).scaled(100)
    if not ci.has_interval:
        return f"{ci.estimate:.1f}"
    return f"{ci.estimate:.1f} [{ci.low:.1f}, {ci.high:.1f}] (n={ci.n})"


def _by_seed(arm: Arm, sel: str) -> dict[int, float]:
    """The arm's average per seed (a run without a recorded seed keys by its position)."""
    seeds, values = arm.seeds[sel], arm.values[sel].get("average", [])
    pairs = enumerate(zip(seeds, values, strict=False))
    return {(s if s is not None else -1 - i): v for i, (s, v) in pairs}


def _delta(ref: Arm, arm: Arm, sel: str) -> str:
    a, b = _by_seed(ref, sel), _by_seed(arm, sel)
    if not a or not b or arm is ref:
        return "—"
    ci, paired = stats.difference(a, b)
    ci = ci.scaled(100)
    if not ci.has_interval:
        return f"{ci.estimate:+.1f}"
    how = "paired" if paired else "unpaired"
    return f"{ci.estimate:+.1f} [{ci.low:+.1f}, {ci.high:+.1f}] (n={ci.n}, {how})"


def rows(table: EvalTable) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: one row per arm and checkpoint (last, then best, side by side), with the
    seeds, the steps evaluated, every benchmark, the average and the difference to the BF16 arm;
    scores in points (x100)."""
    headers = ["run (recipe)", "precision", "checkpoint", "seeds", "steps"]
    headers += [*table.benchmarks, "average", "vs BF16"]
    out = []
    ref = table.arms[table.reference]
    for arm in table.arms:
        for sel in SELECTORS:
            if not arm.seeds.get(sel):
                continue
            steps = ",".join(str(s) for s in sorted(set(arm.steps[sel])))
            row = [arm.recipe, arm.precision.upper(), sel, str(len(arm.seeds[sel])), steps]
            row += [_cell(arm.values[sel].get(n, [])) for n in [*table.benchmarks, "average"]]
            out.append(row + [_delta(ref, arm, sel)])
    return headers, out


def passk_rows(table: EvalTable) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of pass@k: one row per arm, checkpoint and benchmark, one column per k
    (points, mean over seeds with its Student-t interval)."""
    ks = sorted(
        {k for a in table.arms for b in a.passk.values() for d in b.values() for k in d}, key=int
    )
    headers = ["run (recipe)", "checkpoint", "benchmark", *(f"pass@{k}" for k in ks)]
    out = []
    for arm in table.arms:
        for sel in SELECTORS:
            for name in table.benchmarks:
                per_k = arm.passk.get(sel, {}).get(name)
                if per_k:
                    out.append([arm.recipe, sel, name, *(_cell(per_k.get(k, [])) for k in ks)])
    return headers, out


def _question_rates(runs: list[tuple[list[int], int]]) -> list[float] | None:
    """Per problem, the success rate pooled over an arm's seeds (None when the seeds' problem
    lists differ in length, i.e. are not the same problems)."""
    if not runs or len({len(c) for c, _ in runs}) != 1:
        return None
    return [sum(c[j] for c, _ in runs) / sum(n for _, n in runs) for j in range(len(runs[0][0]))]


def question_rows(table: EvalTable) -> tuple[list[str], list[list[str]]]:
    """Per-question paired differences against the BF16 arm: per benchmark and checkpoint, the
    mean over problems of (arm's success rate − BF16's) with the Student-t interval over problems
    (n = problems; each arm's rate pools its seeds' samples)."""
    headers = ["run (recipe)", "checkpoint", "benchmark", "vs BF16, per question (points)"]
    ref, out = table.arms[table.reference], []
    for arm in table.arms:
        if arm is ref:
            continue
        for sel in SELECTORS:
            for name in table.benchmarks:
                a = _question_rates(arm.questions.get(sel, {}).get(name, []))
                b = _question_rates(ref.questions.get(sel, {}).get(name, []))
                if a is None or b is None or len(a) != len(b):
                    continue
                ci = stats.mean_interval([x - y for x, y in zip(a, b, strict=True)]).scaled(100)
                cell = f"{ci.estimate:+.1f} [{ci.low:+.1f}, {ci.high:+.1f}] (n={ci.n} questions)"
                out.append([arm.recipe, sel, name, cell])
    return headers, out


def notes(table: EvalTable) -> list[str]:
    """What the table does and does not show."""
    out = [
        "Scores are avg@n in points (x100); [lo, hi] (n=k) = 95 % Student-t interval over k seeds.",
        "pass@k: the unbiased estimator over each problem's n samples (k <= n), mean over "
        "problems, then over seeds.",
        "Per question: the same problems in both arms; the interval is over problems (n = "
        "questions), so it shows how consistent a difference is across questions, not across "
        "seeds.",
    ]
    if all(max((len(v) for v in a.seeds.values()), default=0) < 2 for a in table.arms):
        out.append(
            "One seed per run: no interval; a difference between single runs is not evidence."
        )
    out.append(SELECTION_BIAS)
    out += [f"missing {k}: {v}" for k, v in table.missing.items()]
    return out


def markdown(tables: Sequence[EvalTable]) -> str:
    """All tables as Markdown (for `evaluation.md` in the report directory)."""
    lines = []
    for t in tables:
        for title, (headers, body) in _sections(t):
            if not body:
                continue
            lines += [f"## {title}", "", "| " + " | ".join(headers) + " |"]
            lines.append("|" + "---|" * len(headers))
            lines += ["| " + " | ".join(r) + " |" for r in body] + [""]
        lines += [f"- {n}" for n in notes(t)] + [""]
    return "\n".join(lines)


def _sections(t: EvalTable) -> list[tuple[str, tuple[list[str], list[list[str]]]]]:
    """(title, (headers, rows)) of each table of a suite: scores, pass@k, per question."""
    return [
        (f"Evaluation: {t.suite}", rows(t)),
        (f"pass@k: {t.suite}", passk_rows(t)),
        (f"Per-question paired differences: {t.suite}", question_rows(t)),
    ]


def html(tables: Sequence[EvalTable]) -> str:
    """All tables as an HTML section (for `report.html`), the same content as `markdown`."""
    import html as _html

    from nemo_fp8_rl.analysis.render import html_table

    parts = []
    for t in tables:
        for title, (headers, body) in _sections(t):
            if body:
                parts.append(f"<h2>{_html.escape(title)}</h2>" + html_table(headers, body))
        parts.append("<ul>" + "".join(f"<li>{_html.escape(n)}</li>" for n in notes(t)) + "</ul>")
    return "\n".join(parts)


def print_tables(tables: Sequence[EvalTable], console: Any = None) -> None:
    """Rich tables in the terminal."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=200)
    for t in tables:
        for title, (headers, body) in _sections(t):
            if not body:
                continue
            table = Table(title=title.lower())
            for h in headers:
                table.add_column(h)
            for r in body:
                table.add_row(*(escape(c) for c in r))
            console.print(table)
        for n in notes(t):
            console.print(f"  {escape(n)}")


def has_evaluations(run_dirs: Sequence[Path]) -> bool:
    """True when any run directory has an `eval/` folder with results."""
    return any(run_results(Path(d)) for d in run_dirs)
