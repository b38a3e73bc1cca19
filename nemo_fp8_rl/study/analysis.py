"""Per-seed summaries of the study runs and their 95 % bootstrap intervals over seeds.

Per run (from `metrics.jsonl`, training steps k ≥ 1):
- `ratio_amplification = Σ_k ratio_nmae_k / Σ_k prob_nmae_k` over the shadow steps, with
  `prob_nmae = Σ|p̃ − p| / Σp` and `ratio_nmae = Σ|r̃ − r| / Σr` (FP8 vs BF16 shadow, same tokens);
- `clip_lower_frac_neg`: mean over steps of the share of negative-advantage tokens clipped at
  the lower bound in force (what the loss did);
- `shadow_fp8_lower_frac_neg`, `shadow_bf16_lower_frac_neg`: on the shadow steps, the shares
  of negative-advantage tokens whose FP8 / BF16 ratio is below the nominal 1 − ε (same tokens);
- `val_tail`: mean validation accuracy (greedy) of the last `TAIL` validations; `val_start`;
- `entropy_surges`: onsets found by `nemo_fp8_rl.analysis.surge.detect_entropy_surges` on train/entropy;
- `calib_low_min`: lowest lower bound L in force; `calib_m_mean`: mean over calibrations of m,
  the BF16-clipped negative-advantage tokens the quantile-matched L* rests on;
- `warmup_steps`: supervised warm-up steps of the seed; `warmup_seconds` (0 when the run
  found it cached), `wall_seconds` and `wall_seconds_without_warmup` of the run's process.
Intervals (`nemo_fp8_rl.analysis.stats`, the same as `compare`'s): percentile bootstrap of the mean over
seeds (10,000 resamples, fixed generator); differences between recipes are paired by seed
(bootstrap of the mean per-seed difference), quotients are ratios of the means with both sides
resampled on the same seeds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.surge import detect_entropy_surges

TAIL = 3


@dataclass(frozen=True)
class Interval:
    """Mean over seeds and its 95 % percentile-bootstrap interval (NaN bounds below 2 seeds)."""

    mean: float
    low: float
    high: float
    n: int

    def fmt(self, spec: str = "{:.3f}") -> str:
        """`mean [low, high]`, `mean (1 seed)`, or `—` without values."""
        if self.n == 0:
            return "—"
        if self.n < 2:
            return spec.format(self.mean) + " (1 seed)"
        return f"{spec.format(self.mean)} [{spec.format(self.low)}, {spec.format(self.high)}]"


def _own(iv: stats.Interval) -> Interval:
    return Interval(iv.estimate, iv.low, iv.high, iv.n)


def bootstrap_mean(values: list[float]) -> Interval:
    """Percentile bootstrap of the mean of the finite `values` (`nemo_fp8_rl.analysis.stats`)."""
    return _own(stats.bootstrap_mean([math.nan if v is None else v for v in values]))


def paired(a: dict[int, float], b: dict[int, float], op: str) -> Interval:
    """`a` against `b` over seeds, paired by seed (`nemo_fp8_rl.analysis.stats`).

    op 'diff': mean(a − b) with the bootstrap of the per-seed differences; op 'ratio':
    mean(a) / mean(b) with both sides resampled on the same seeds.
    """
    if op == "diff":
        return _own(stats.difference(b, a)[0])
    return _own(stats.ratio(b, a))


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


def read_records(run_dir: Path) -> list[dict]:
    """The run's metric records, in order."""
    text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def summarize(run_dir: Path) -> dict[str, float]:
    """The per-run summary values of the module docstring."""
    recs = read_records(run_dir)
    train = [r for r in recs if r["step"] >= 1 and r.get("train/entropy") is not None]
    shadow = [r for r in train if r.get("train/prob_nmae") is not None]
    vals = [
        (r["step"], r["validation/accuracy"])
        for r in recs
        if r.get("validation/accuracy") is not None
    ]
    later = [v for s, v in vals if s > 0]
    start = next((r for r in recs if r["step"] == 0), {})
    out = {
        "ratio_amplification": (
            sum(r["train/ratio_nmae"] for r in shadow) / sum(r["train/prob_nmae"] for r in shadow)
            if shadow
            else math.nan
        ),
        "prob_nmae": _mean([r.get("train/prob_nmae") for r in shadow]),
        "ratio_nmae": _mean([r.get("train/ratio_nmae") for r in shadow]),
        "clip_lower_frac_neg": _mean([r.get("train/clip_lower_frac_neg") for r in train]),
        "shadow_fp8_lower_frac_neg": _mean(
            [r.get("train/fp8_nominal_lower_frac_neg") for r in shadow]
        ),
        "shadow_bf16_lower_frac_neg": _mean([r.get("train/bf16_lower_frac_neg") for r in shadow]),
        "val_tail": _mean(later[-TAIL:]),
        "val_start": start.get("validation/accuracy", math.nan),
        "entropy_mean": _mean([r["train/entropy"] for r in train]),
        "entropy_surges": float(
            len(
                detect_entropy_surges(
                    [r["step"] for r in train], [r["train/entropy"] for r in train]
                )
            )
        ),
        "warmup_steps": start.get("warmup/steps", math.nan),
        "calib_low_min": min(
            (r["train/calib_low"] for r in train if r.get("train/calib_low") is not None),
            default=math.nan,
        ),
        "calib_m_mean": _mean([r.get("train/calib_bf16_lower_count_neg") for r in train]),
        "steps": float(len(train)),
    }
    wall = run_dir / "study_wall_seconds.json"
    out["wall_seconds"] = json.loads(wall.read_text())["seconds"] if wall.exists() else math.nan
    env = run_dir / "environment.json"
    info = (json.loads(env.read_text()).get("warmup") or {}) if env.exists() else {}
    # the seed's warm-up runs once (in the first run of that seed) and is cached for the others
    out["warmup_seconds"] = 0.0 if info.get("cached", True) else info.get("seconds", math.nan)
    out["wall_seconds_without_warmup"] = out["wall_seconds"] - out["warmup_seconds"]
    return out


def collect(out: Path, names: list[str], seeds: list[int]) -> dict[str, dict[int, dict]]:
    """`{recipe name: {seed: summary}}` for the runs that finished."""
    table: dict[str, dict[int, dict]] = {}
    for name in names:
        table[name] = {}
        for seed in seeds:
            run = out / name / f"seed-{seed}"
            if (run / "metrics.jsonl").exists():
                table[name][seed] = summarize(run)
    return table


def column(table: dict[str, dict[int, dict]], name: str, key: str) -> dict[int, float]:
    """Per-seed values of one summary key for one recipe."""
    return {seed: s[key] for seed, s in table.get(name, {}).items()}
