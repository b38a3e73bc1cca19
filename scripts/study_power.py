"""Seeds for the CPU study from a precision target on the committed runs' paired SD.

For each paired difference of the primary accuracy endpoint (`nemo_fp8_rl/study/endpoints.yaml`:
mean validation accuracy over every evaluation after step 0), the per-seed differences of the
committed runs (`docs/study/runs/`) give the paired SD s (n0 seeds). With n seeds the 95 %
Student-t interval of the mean difference has half-width h(n) = t(0.975, n − 1)·s/√n; the study
needs the smallest n with h(n) ≤ `resolve_points` (endpoints.yaml). That is a precision target,
not a power calculation: with h(n) equal to a true difference of that size, the estimate lands
above or below it about equally often, so its interval is clear of 0 about half the time (about
50 % power); 80 % power would need h(n) near 0.7 of it (1.96 / (1.96 + 0.84), many seeds). s is
itself estimated from n0 seeds, so the n it implies is a planning figure, not a guarantee.

    uv run python scripts/study_power.py          # the table in docs/study/README.md
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.analysis.stats import t_quantile  # noqa: E402
from nemo_fp8_rl.cli.study import NAMES, ROLES  # noqa: E402
from nemo_fp8_rl.study import analysis, endpoints  # noqa: E402

RUNS = ROOT / "docs" / "study" / "runs"
SEEDS = (3, 5, 8, 10, 15, 20)
PAIRS = (("fp8_uncal", "bf16"), ("fp8_cal", "fp8_uncal"), ("fp8_cal", "bf16"))
BEGIN, END = "<!-- power-table:begin -->", "<!-- power-table:end -->"


def paired_sd(table: dict, a: str, b: str) -> tuple[float, int]:
    """SD of the per-seed differences a − b of `val_mean`, and how many seeds it rests on."""
    x, y = (analysis.column(table, ROLES[r], "val_mean") for r in (a, b))
    d = [x[s] - y[s] for s in sorted(set(x) & set(y))]
    mean = sum(d) / len(d)
    return math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1)), len(d)


def half_width(sd: float, n: int) -> float:
    """95 % Student-t half-width of a mean of n paired differences with SD `sd`."""
    return t_quantile(0.95, n - 1) * sd / math.sqrt(n)


def seeds_needed(sd: float, points: float) -> int:
    """Smallest n ≥ 2 with half-width ≤ `points`/100."""
    n = 2
    while half_width(sd, n) > points / 100:
        n += 1
    return n


def table(runs: Path = RUNS) -> str:
    """Markdown: paired SD, half-width at several seed counts, seeds needed."""
    ep = endpoints.load()
    seeds = sorted(int(p.name.split("-")[1]) for p in (runs / NAMES[0]).glob("seed-*"))
    data = analysis.collect(runs, NAMES, seeds)
    head = " | ".join(f"±h, n={n}" for n in SEEDS)
    lines = [
        f"Primary accuracy endpoint (mean after step 0), committed runs (`docs/study/runs/`, seeds "
        f"{', '.join(map(str, seeds))}; {analysis.report_scoring(data)}); h = 95 % Student-t "
        f"half-width in points; n needed: smallest n with h ≤ {ep.seeds.resolve_points:g} point.",
        "",
        f"| paired difference | paired SD (n0) | {head} | n needed |",
        "|---|---|" + "---|" * len(SEEDS) + "---|",
    ]
    for a, b in PAIRS:
        sd, n0 = paired_sd(data, a, b)
        cells = " | ".join(f"{100 * half_width(sd, n):.2f}" for n in SEEDS)
        lines.append(
            f"| {ROLES[a]} − {ROLES[b]} | {sd:.4f} ({n0}) | {cells} | "
            f"{seeds_needed(sd, ep.seeds.resolve_points)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
