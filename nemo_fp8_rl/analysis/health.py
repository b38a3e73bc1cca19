"""Each compared run's health, and a BF16 control's own floor beside the FP8 runs.

The health line judges the run against `guards/health_ranges.yaml` for its precision (from its
saved recipe; without one, BF16 or FP8 as the comparison names it): the verdict is its
statistics over all steps, and the windows that left the range are listed with their steps
(`guards.health.run_health`). A BF16 control's mismatch is a floor, not zero: kernel choices
alone moved Megatron's BF16 `token_mult_prob_error` median to 38,565 until RoPE and
bias-activation fusion were disabled (NVIDIA-NeMo/RL#1801), so each FP8 run's medians are shown
next to the control's, with the excess, and its lower-clip share over the control's against
the paper's ~4x.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nemo_fp8_rl.analysis.rundata import RunData
from nemo_fp8_rl.guards.health import load_table, median_of, precision_of, run_health

FLOOR_METRICS = ("train/token_mult_prob_error", "train/gen_kl_error")


def run_records(run: RunData) -> list[dict[str, Any]]:
    """The run as `metrics.jsonl`-style records: one per step, plus the event lines it wrote."""
    by_step: dict[int, dict[str, Any]] = {}
    for name, series in run.metrics.items():
        for step, value in zip(series.steps.tolist(), series.values.tolist(), strict=True):
            by_step.setdefault(int(step), {"step": int(step)})[name] = value
    records = [by_step[s] for s in sorted(by_step)]
    for source in run.sources:
        if source.suffix != ".jsonl" or not source.is_file():
            continue
        for line in source.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"event"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("event"), dict):
                records.append(record)
    return records


def _precision(run: RunData, named: str) -> str:
    if run.config:
        return precision_of(run.config)
    return "bf16" if named == "bf16" else "fp8"


def health_notes(
    runs: Sequence[RunData], precisions: Sequence[str], reference: int
) -> list[list[str]]:
    """Per run, the notes to show: its health line, and for an FP8 run the BF16 control's floor."""
    records = [run_records(r) for r in runs]
    classes = [_precision(r, p) for r, p in zip(runs, precisions, strict=True)]
    engines = [(r.environment or {}).get("engine") for r in runs]
    out = [
        [run_health(rec, cls, engine).line()]
        for rec, cls, engine in zip(records, classes, engines, strict=True)
    ]
    control = reference if classes[reference] == "bf16" else None
    if control is None:
        return out
    floor = {
        m: median_of(records[control], m) for m in (*FLOOR_METRICS, load_table().control["metric"])
    }
    for i, cls in enumerate(classes):
        if i == control or cls == "bf16":
            continue
        parts = []
        for metric in FLOOR_METRICS:
            mine, base = median_of(records[i], metric), floor[metric]
            if mine is not None and base is not None:
                name = metric.removeprefix("train/")
                parts.append(
                    f"{name} median {mine:.4g} vs control floor {base:.4g} (excess {mine - base:+.3g})"
                )
        clip = load_table().control
        mine, base = median_of(records[i], clip["metric"]), floor[clip["metric"]]
        if mine is not None and base:
            ratio = mine / base
            flag = "above" if ratio > clip["limit"] else "within"
            parts.append(
                f"{clip['metric'].removeprefix('train/')} {ratio:.3g}x the control's ({flag} "
                f"{clip['limit']:g}x: {clip['source']})"
            )
        if parts:
            out[i].append(
                f"BF16 control {runs[control].name}: "
                + "; ".join(parts)
                + " (NVIDIA-NeMo/RL#1801: a kernel floor)"
            )
    return out
