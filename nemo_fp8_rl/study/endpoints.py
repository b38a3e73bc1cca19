"""The studies' endpoints (`endpoints.yaml`, read by the report and the power script): the CPU
study's, fixed after its committed runs were made, the precision dose study's (`dose:`) and the
4-bit rescue study's (`rescue:`), each fixed before its runs.

Per run, from its metric records (training steps k ≥ 1, validations at step 0 and later):
- `mean_after_start`: mean of the validation accuracy over every evaluation after step 0;
- `gain_from_start`: that mean minus the step-0 evaluation;
- `largest_rise_above_trailing_min`: max over steps k of e_k − min(e_{k−w}, …, e_{k−1}), the
  entropy's largest rise above its minimum over the previous w = `window` steps (steps with
  fewer than w earlier values use those they have, at least one); a surge when ≥ `threshold`.
The accuracy score is `runs.scores.accuracy_key`: BF16 generation where the run logged it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_fp8_rl.config.errors import RecipeError
from nemo_fp8_rl.config.safe_yaml import load_yaml_file
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.runs import scores

FILE = Path(__file__).with_name("endpoints.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Accuracy(_Strict):
    primary: Literal["mean_after_start"]
    secondary: Literal["gain_from_start"]
    score: Literal["validation/bf16_accuracy"]


class Surge(_Strict):
    statistic: Literal["largest_rise_above_trailing_min"]
    window: int = Field(ge=1)
    threshold: float = Field(gt=0)


class Seeds(_Strict):
    alpha: float = Field(gt=0, lt=1)
    resolve_points: float = Field(gt=0)


class DoseSurge(_Strict):
    statistic: Literal["largest_rise_above_trailing_min"]
    window: int = Field(ge=1)
    threshold_rule: Literal["bf16_mean_plus_2sd"]
    threshold: float | None = Field(None, gt=0)


class PassAtK(_Strict):
    k: list[int] = Field(min_length=1)
    samples: int = Field(ge=1)


class Dose(_Strict):
    """The precision dose study's pre-registered design (endpoints.yaml `dose:`)."""

    recipes: str
    formats: list[str] = Field(min_length=1)
    run_order: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=2)
    steps: int = Field(ge=1)
    primary: Literal["gain_from_start"]
    score: Literal["validation/bf16_accuracy"]
    pass_at_k: PassAtK
    dose_metric: Literal["ratio_nmae"]
    clip_shares: list[str]
    alpha: float = Field(gt=0, lt=1)
    entropy_surge: DoseSurge


class Reproducibility(_Strict):
    arm: str
    seed: int


class Rescue(_Strict):
    """The 4-bit rescue study's pre-registered design (endpoints.yaml `rescue:`)."""

    recipes: str
    reference: str
    reproducibility: Reproducibility
    reference_arms: list[str] = Field(default_factory=list)
    formats: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=2)
    steps: int = Field(ge=1)
    primary: Literal["gain_from_start"]
    score: Literal["validation/bf16_accuracy"]
    phases: list[list[str]] = Field(min_length=1)
    alpha: float = Field(gt=0, lt=1)
    multiplicity: Literal["holm"]


class Endpoints(_Strict):
    accuracy: Accuracy
    entropy_surge: Surge
    seeds: Seeds
    dose: Dose | None = None
    rescue: Rescue | None = None


def load(path: Path = FILE) -> Endpoints:
    """The endpoints file, validated; a bad file is a UsageError naming it."""
    try:
        return Endpoints.model_validate(load_yaml_file(path))
    except RecipeError as exc:
        raise UsageError(
            str(path), f"not a valid endpoints file ({exc.issues[0].what})", "restore it"
        ) from exc
    except ValidationError as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(str(path), f"not a valid endpoints file ({first})", "restore it") from exc


def accuracy_endpoints(records: list[dict]) -> dict[str, float]:
    """`mean_after_start`, `gain_from_start`, `start`, and `scored_bf16` (1.0 or 0.0)."""
    key = scores.accuracy_key(records)
    vals = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    later = [v for s, v in vals if s > 0]
    start = next((v for s, v in vals if s == 0), math.nan)
    mean = sum(later) / len(later) if later else math.nan
    return {
        "mean_after_start": mean,
        "gain_from_start": mean - start,
        "start": start,
        "scored_bf16": float(key == scores.BF16_ACCURACY),
    }


def largest_rise(values: list[float], window: int) -> float:
    """max_k e_k − min of the previous `window` values (NaN for fewer than two values)."""
    best = -math.inf
    for k in range(1, len(values)):
        best = max(best, values[k] - min(values[max(0, k - window) : k]))
    return best if math.isfinite(best) else math.nan


def describe(ep: Endpoints) -> str:
    """The endpoints as Markdown bullets (for the report, from the file)."""
    s = ep.entropy_surge
    return "\n".join(
        [
            "- accuracy, primary: mean validation accuracy (greedy) over every evaluation after "
            "step 0; secondary: that mean minus the step-0 evaluation; score: the trained "
            f"weights generated in BF16 (`{ep.accuracy.score}`), or, for runs without it, the "
            "run's rollout engine's score, named so in the tables",
            f"- entropy surge: the largest rise of `train/entropy` above its minimum over the "
            f"previous {s.window} steps; a surge when it reaches {s.threshold:g} nats",
            f"- seeds: a precision target from `scripts/study_power.py` (95 % Student-t "
            f"half-width of a paired difference of the primary endpoint ≤ "
            f"{ep.seeds.resolve_points:g} points, from the committed runs' paired SD); not a "
            f"power calculation: at that n a true difference of {ep.seeds.resolve_points:g} "
            "points gives an interval clear of 0 only about half the time",
            f"(from `nemo_fp8_rl/study/{FILE.name}`)",
        ]
    )
