"""The precision dose study: arms, the surge threshold rule, and (from archived runs) its tables.

Arms: `bf16`, and for each format of `endpoints.yaml` (`dose.formats`) `<fmt>-uncalibrated`
and `<fmt>` (calibrated); recipe files `recipes/study/dose/grpo-dose-<arm>.yaml`.
Surge threshold (pre-registered rule `bf16_mean_plus_2sd`): with r_s the largest rise of
train/entropy above its trailing-window minimum in BF16 seed s, `threshold = mean(r) + 2 SD(r)`
(sample SD, n − 1).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from nemo_fp8_rl.study import endpoints

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "study" / "dose"
DOCS = ROOT / "docs" / "study" / "dose"
ARCHIVE = DOCS / "runs"


def arm_name(arm: str) -> str:
    """The recipe (and run folder) name of an arm: `grpo-dose-<arm>`."""
    return f"grpo-dose-{arm}"


def arms(formats: list[str]) -> list[str]:
    """Recipe names of the arms of `formats` (`bf16`, or a study format: both its arms)."""
    known = endpoints.load().dose.formats
    out = []
    for fmt in formats:
        if fmt == "bf16":
            out.append(arm_name("bf16"))
        elif fmt in known:
            out += [arm_name(f"{fmt}-uncalibrated"), arm_name(fmt)]
        else:
            raise ValueError(f"unknown dose format {fmt!r}: use bf16 or one of {known}")
    return out


def largest_rise(records: list[dict], window: int) -> float:
    """The largest rise of train/entropy above its trailing-window minimum (steps ≥ 1)."""
    ent = [r["train/entropy"] for r in records if r["step"] >= 1 and "train/entropy" in r]
    return endpoints.largest_rise(ent, window)


def surge_threshold(rises: list[float]) -> float:
    """mean + 2 SD of the BF16 seeds' largest rises (module doc); needs two seeds."""
    vals = [r for r in rises if math.isfinite(r)]
    if len(vals) < 2:
        raise ValueError(f"the surge threshold needs >= 2 finished BF16 runs, got {len(vals)}")
    return statistics.fmean(vals) + 2 * statistics.stdev(vals)
