"""The comparison's verdicts as data: `verdict.json` beside `report.md`, and `compare --json`.

Scripts and CI read the outcome here instead of parsing the report's sentences. One entry per
run (or recipe group) that is compared with the reference, each with `outcome`:

- `match`: one run per side, accuracy within `tolerance_points` of the reference;
- `within_noise`: several seeds, the 95 % Student-t interval of the gap contains 0;
- `higher` / `lower`: outside the tolerance (one run) or the interval excludes 0 (seeds);
- `not_comparable`: neither validation accuracy nor reward was logged by both sides.

`ok` is true when no entry is `lower` or `not_comparable`. Numbers that are unknown (a run that
logged no step time) are `null`, never NaN, so the file is strict JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nemo_fp8_rl.analysis.compare import Comparison, accuracy_gap, speed_refusal, speedup
from nemo_fp8_rl.analysis.groups import GroupComparison
from nemo_fp8_rl.config.safe_files import write_atomic

SCHEMA_VERSION = 1
BAD_OUTCOMES = ("lower", "not_comparable")


def _number(value: float | None) -> float | None:
    """A finite float, or None (JSON null) for NaN, inf and missing values."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _outcome(points: float, tolerance_points: float) -> str:
    if abs(points) <= tolerance_points:
        return "match"
    return "higher" if points > 0 else "lower"


def runs_verdict(comparison: Comparison, tolerance_points: float) -> dict[str, Any]:
    """Verdicts of a run-by-run comparison (`compare_runs`): gap in points, speedup, surge."""
    ref = comparison.reference
    reference = comparison.runs[ref]
    entries = []
    text = iter(comparison.verdicts)
    for i, (run, summary) in enumerate(zip(comparison.runs, comparison.summaries, strict=True)):
        if i == ref or summary.precision == "bf16":
            continue
        gap = accuracy_gap(reference, run)
        entries.append(
            {
                "name": summary.name,
                "precision": summary.precision,
                "outcome": "not_comparable" if gap is None else _outcome(gap[0], tolerance_points),
                "accuracy_gap_points": None if gap is None else _number(gap[0]),
                "accuracy_metric": None if gap is None else gap[1],
                "accuracy_step": None if gap is None else gap[2],
                "interval": None,
                "seeds": None,
                "speedup": None
                if speed_refusal(reference, run)
                else _number(speedup(reference, run)),
                "speed_note": speed_refusal(reference, run),
                "entropy_surge_step": summary.surge_step,
                "text": next(text),
            }
        )
    return _document("runs", comparison.summaries[ref].name, tolerance_points, entries)


def groups_verdict(groups: GroupComparison, tolerance_points: float) -> dict[str, Any]:
    """Verdicts of a comparison of recipes over seeds (`compare_groups`): the gap's interval."""
    ref = groups.summaries[groups.reference]
    entries = []
    text = iter(groups.verdicts)
    for i, summary in enumerate(groups.summaries):
        if i == groups.reference:
            continue
        gap = groups.gaps[summary.name]
        entry: dict[str, Any] = {
            "name": summary.name,
            "precision": summary.precision,
            "outcome": "not_comparable",
            "accuracy_gap_points": None,
            "accuracy_metric": None,
            "accuracy_step": None,
            "interval": None,
            "seeds": list(summary.seeds),
            "speedup": None,
            "entropy_surges": summary.surges,
            "text": next(text),
        }
        if gap is not None:
            iv = gap.interval
            entry.update(
                accuracy_gap_points=_number(iv.estimate),
                accuracy_metric=gap.label,
                accuracy_step=gap.step,
            )
            if iv.has_interval:
                entry["interval"] = {
                    "low": _number(iv.low),
                    "high": _number(iv.high),
                    "n": iv.n,
                    "paired": gap.paired,
                    "method": f"95 % {iv.method} interval of the mean difference",
                }
                entry["outcome"] = (
                    "within_noise" if iv.contains(0.0) else _outcome(iv.estimate, 0.0)
                )
            else:
                entry["outcome"] = _outcome(iv.estimate, tolerance_points)
        entries.append(entry)
    return _document("groups", ref.name, tolerance_points, entries)


def _document(kind: str, reference: str, tolerance: float, entries: list[dict]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "reference": reference,
        "tolerance_points": _number(tolerance),
        "ok": all(e["outcome"] not in BAD_OUTCOMES for e in entries),
        "verdicts": entries,
    }


def dumps(document: dict[str, Any]) -> str:
    """Strict JSON text (NaN refused), indented, with a final newline."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def write_verdict(document: dict[str, Any], out: Path) -> Path:
    """Write `out/verdict.json` atomically (a temporary file renamed over it); returns the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "verdict.json"
    write_atomic(path, dumps(document), mode=0o644)
    return path
