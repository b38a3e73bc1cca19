"""The 4-bit rescue study: arms, run layout, and the reproducibility check of its reference.

Pre-registered in `endpoints.yaml` (`rescue:`). Arms are recipe files
`recipes/study/rescue/grpo-rescue-<arm>.yaml`, run over the study's seeds phase by phase; the
reference arms (BF16, each format uncalibrated and calibrated) are the dose study's archived runs,
used only when one of them, rerun at the study's commit, reproduces its archived metrics exactly
(`reproduce_differences`).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from nemo_fp8_rl.study import dose, endpoints

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "study" / "rescue"
DOCS = ROOT / "docs" / "study" / "rescue"
ARCHIVE = DOCS / "runs"
PAGE = DOCS.parent / "rescue.md"
BLOCK = ("<!-- rescue-tables:begin -->", "<!-- rescue-tables:end -->")
# Keys that measure the machine, not the run: wall time, throughput, load, per-stage timing.
TIMING_PREFIXES = ("timing/", "perf/", "throughput/", "system/")
TIMING_KEYS = ("wall_seconds", "tokens_per_second", "step_seconds", "time")


def arm_name(arm: str) -> str:
    """The recipe (and run folder) name of a rescue arm: `grpo-rescue-<arm>`."""
    return f"grpo-rescue-{arm}"


def phase_arms(phase: int) -> list[str]:
    """The arms of pre-registered phase `phase` (1-based), in run order."""
    phases = endpoints.load().rescue.phases
    if not 1 <= phase <= len(phases):
        raise ValueError(f"the rescue study has phases 1-{len(phases)}, got {phase}")
    return list(phases[phase - 1])


def recipe_path(arm: str) -> Path:
    """A rescue arm's recipe, or for a reference arm (`rescue.reference_arms`) the dose study's."""
    if arm in endpoints.load().rescue.reference_arms:
        return dose.RECIPES / f"{dose.arm_name(arm)}.yaml"
    return RECIPES / f"{arm_name(arm)}.yaml"


def run_name(arm: str) -> str:
    """The run folder name of an arm (its recipe's file name)."""
    return recipe_path(arm).stem


def recipe_paths(arms: list[str]) -> list[Path]:
    """Recipe files of `arms`; a missing one is a ValueError naming it."""
    paths = [recipe_path(a) for a in arms]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"no recipe for arm(s): {', '.join(missing)}")
    return paths


def _timing(key: str) -> bool:
    return key.startswith(TIMING_PREFIXES) or any(t in key for t in TIMING_KEYS)


def _same(a: object, b: object) -> bool:
    """Equal, with NaN equal to NaN (a metric that is NaN in both runs reproduces)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def read_metrics(path: Path) -> list[dict]:
    """Records of a `metrics.jsonl` or an archived `metrics.jsonl.gz`."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def reproduce_differences(rerun: list[dict], archived: list[dict]) -> list[str]:
    """Every non-timing value that differs between two runs' records, as `step N key: a != b`
    (also steps or keys present in one only); empty when the rerun reproduces bit for bit.
    Event records (`{"step", "event"}`: health notices) are not metrics and are left out."""
    rerun, archived = ([r for r in rs if "event" not in r] for rs in (rerun, archived))
    diffs = []
    if len(rerun) != len(archived):
        diffs.append(f"records: {len(rerun)} != {len(archived)}")
    for new, old in zip(rerun, archived, strict=False):
        step = old.get("step")
        for key in sorted(set(new) | set(old)):
            if _timing(key):
                continue
            if key not in new or key not in old:
                diffs.append(
                    f"step {step} {key}: only in the {'rerun' if key in new else 'archive'}"
                )
            elif not _same(new[key], old[key]):
                diffs.append(f"step {step} {key}: {new[key]!r} != {old[key]!r}")
    return diffs


def compared_values(records: list[dict]) -> int:
    """How many values `reproduce_differences` compares in a run's records (non-timing values
    of the metric records)."""
    return sum(1 for r in records if "event" not in r for k in r if not _timing(k))
