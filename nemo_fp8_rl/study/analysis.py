"""Per-seed summaries of the study runs and their 95 % intervals over seeds.

Per run (from `metrics.jsonl`, or `metrics.jsonl.gz` in the committed archive; training steps
k ≥ 1):
- `ratio_amplification = Σ_k ratio_nmae_k / Σ_k prob_nmae_k` over the shadow steps, with
  `prob_nmae = Σ|p̃ − p| / Σp` and `ratio_nmae = Σ|r̃ − r| / Σr` (FP8 vs BF16 shadow, same tokens):
  the paper-style quotient, ≈ 2 even for one FP8 pass because its sides weigh tokens differently;
- `ratio_compounding = Σ_k ratio_nmae_k / Σ_k single_pass_nmae_k`: the ratio error over the
  error one FP8 pass causes alone in the same weighting (`trainer.shadow_metrics`): √2 when the
  two passes' errors are independent, 0 when they cancel;
- `clip_lower_frac_neg`: mean over steps of the share of negative-advantage tokens clipped at
  the lower bound in force (what the loss did);
- `shadow_fp8_lower_frac_neg`, `shadow_bf16_lower_frac_neg`: on the shadow steps, the shares
  of negative-advantage tokens whose FP8 / BF16 ratio is below the nominal 1 − ε (same tokens);
- the endpoints (`endpoints.yaml`, `endpoints.py`; fixed after the committed runs were made): `val_mean` (primary: mean
  validation accuracy over every evaluation after step 0), `val_gain` (secondary: `val_mean` −
  `val_start`), `entropy_rise` (largest rise above the trailing-window minimum) and
  `entropy_surge` (1 when it reaches the threshold); `val_scored_bf16` says whether the run's
  scores are BF16 generation (1) or its rollout engine's (0: FP8 generation in FP8 recipes);
- `val_tail`: mean validation accuracy (greedy) of the last `TAIL` validations (the endpoint the
  study reported before endpoints were fixed; kept for the per-seed table);
- `entropy_surges`: onsets found by `analysis.surge.detect_entropy_surges` on train/entropy;
- `calib_low_min`: lowest lower bound L in force; `calib_m_mean`: mean over calibrations of m,
  the BF16-clipped negative-advantage tokens of one window; `calib_pool_mean`: mean M, the
  clipped tokens L* rested on after pooling windows;
- `warmup_steps`, `warmup_accuracy`: supervised warm-up steps of the seed's starting policy
  (shipped in data/warmup/) and its held-out greedy accuracy; `wall_seconds` of the run's
  process.
Intervals over seeds (`analysis.stats`): Student-t of the mean; differences between recipes
paired by seed (t-interval of the per-seed differences); quotients of shares as the geometric
mean of per-seed quotients (t-interval of their logs). n is the number of seeds.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.analysis.surge import detect_entropy_surges
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.runs import scores
from nemo_fp8_rl.study import endpoints

TAIL = 3
METRICS = ("metrics.jsonl", "metrics.jsonl.gz")


@dataclass(frozen=True)
class Interval:
    """Mean over seeds, its 95 % interval (NaN bounds below 2 seeds), n and the method."""

    mean: float
    low: float
    high: float
    n: int
    method: str = "t"

    def fmt(self, spec: str = "{:.3f}") -> str:
        """`mean [low, high] (n=k)`, `mean (n=1)`, or `—` without values."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "—"
        if self.n < 2 or math.isnan(self.low):
            return spec.format(self.mean) + f" (n={self.n})"
        return f"{spec.format(self.mean)} [{_end(self.low, spec)}, {_end(self.high, spec)}] (n={self.n})"


def _end(value: float, spec: str) -> str:
    return spec.format(value) if math.isfinite(value) else ("∞" if value > 0 else "−∞")


def _own(iv: stats.Interval) -> Interval:
    return Interval(iv.estimate, iv.low, iv.high, iv.n, iv.method)


def mean_interval(values: list[float]) -> Interval:
    """Student-t interval of the mean of the finite `values` (`analysis.stats`)."""
    return _own(stats.mean_interval([math.nan if v is None else v for v in values]))


def paired(a: dict[int, float], b: dict[int, float], op: str) -> Interval:
    """`a` against `b` over the seeds both have (`analysis.stats`).

    op 'diff': mean(a − b), t-interval of the per-seed differences; op 'ratio': geometric mean
    of the per-seed quotients a/b with the t-interval of their logs.
    """
    if op == "diff":
        return _own(stats.difference(b, a)[0])
    return _own(stats.log_ratio(b, a))


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


def metrics_file(run_dir: Path) -> Path | None:
    """The run's metrics file (plain or gzip-compressed), None without one."""
    return next((run_dir / n for n in METRICS if (run_dir / n).exists()), None)


def read_records(run_dir: Path) -> list[dict]:
    """The run's metric records, in order; a line that is not a JSON record is a UsageError
    naming the file and line."""
    path = metrics_file(run_dir) or run_dir / METRICS[0]
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise UsageError(
            str(path), f"cannot read the metrics ({exc})", "restore the file or rerun that run"
        ) from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            record = exc
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise UsageError(
                f"{path}:{number}",
                "not a metrics record (a JSON object with an integer step)",
                f"restore the file, or move {run_dir} away and run the study again",
            )
        records.append(record)
    return records


def summarize(run_dir: Path, ep: endpoints.Endpoints | None = None) -> dict[str, float]:
    """The per-run summary values of the module docstring."""
    ep = ep or endpoints.load()
    recs = read_records(run_dir)
    train = [r for r in recs if r["step"] >= 1 and r.get("train/entropy") is not None]
    shadow = [r for r in train if r.get("train/prob_nmae") is not None]
    acc = endpoints.accuracy_endpoints(recs)
    key = scores.accuracy_key(recs)
    later = [r[key] for r in recs if r["step"] > 0 and r.get(key) is not None]
    start = next((r for r in recs if r["step"] == 0), {})
    rise = endpoints.largest_rise([r["train/entropy"] for r in train], ep.entropy_surge.window)
    single = [r for r in shadow if r.get("train/single_pass_nmae") is not None]
    out = {
        "ratio_amplification": (
            sum(r["train/ratio_nmae"] for r in shadow) / sum(r["train/prob_nmae"] for r in shadow)
            if shadow
            else math.nan
        ),
        "ratio_compounding": (
            sum(r["train/ratio_nmae"] for r in single)
            / sum(r["train/single_pass_nmae"] for r in single)
            if single
            else math.nan
        ),
        "single_pass_nmae": _mean([r.get("train/single_pass_nmae") for r in shadow]),
        "prob_nmae": _mean([r.get("train/prob_nmae") for r in shadow]),
        "ratio_nmae": _mean([r.get("train/ratio_nmae") for r in shadow]),
        "clip_lower_frac_neg": _mean([r.get("train/clip_lower_frac_neg") for r in train]),
        "neg_grad_drop_frac_neg": _mean([r.get("train/neg_grad_drop_frac_neg") for r in train]),
        "shadow_fp8_lower_frac_neg": _mean(
            [r.get("train/fp8_nominal_lower_frac_neg") for r in shadow]
        ),
        "shadow_bf16_lower_frac_neg": _mean([r.get("train/bf16_lower_frac_neg") for r in shadow]),
        "val_tail": _mean(later[-TAIL:]),
        "val_start": acc["start"],
        "val_mean": acc["mean_after_start"],
        "val_gain": acc["gain_from_start"],
        "val_scored_bf16": acc["scored_bf16"],
        "val_start_rollout": start.get(scores.ROLLOUT_ACCURACY, math.nan),
        "val_start_bf16": start.get(scores.BF16_ACCURACY, math.nan),
        "entropy_rise": rise,
        "entropy_surge": float(rise >= ep.entropy_surge.threshold)
        if math.isfinite(rise)
        else math.nan,
        "entropy_mean": _mean([r["train/entropy"] for r in train]),
        "entropy_surges": float(
            len(
                detect_entropy_surges(
                    [r["step"] for r in train], [r["train/entropy"] for r in train]
                )
            )
        ),
        "warmup_steps": start.get("warmup/steps", math.nan),
        "warmup_accuracy": start.get("warmup/accuracy", math.nan),
        "calib_low_min": min(
            (r["train/calib_low"] for r in train if r.get("train/calib_low") is not None),
            default=math.nan,
        ),
        "calib_m_mean": _mean([r.get("train/calib_bf16_lower_count_neg") for r in train]),
        "calib_pool_mean": _mean([r.get("train/calib_low_pool_clipped") for r in train]),
        "steps": float(len(train)),
    }
    wall = run_dir / "study_wall_seconds.json"
    out["wall_seconds"] = json.loads(wall.read_text())["seconds"] if wall.exists() else math.nan
    return out


def collect(out: Path, names: list[str], seeds: list[int]) -> dict[str, dict[int, dict]]:
    """`{recipe name: {seed: summary}}` for the runs that finished."""
    table: dict[str, dict[int, dict]] = {}
    for name in names:
        table[name] = {}
        for seed in seeds:
            run = out / name / f"seed-{seed}"
            if metrics_file(run) is not None:
                table[name][seed] = summarize(run)
    return table


def report_scoring(table: dict[str, dict[int, dict]]) -> str:
    """How the runs in `table` were scored, in a few words."""
    flags = [s.get("val_scored_bf16") for runs in table.values() for s in runs.values()]
    if flags and all(f == 1.0 for f in flags):
        return "BF16-scored"
    return "scored in each run's rollout precision: FP8 generation for FP8 recipes"


def column(table: dict[str, dict[int, dict]], name: str, key: str) -> dict[int, float]:
    """Per-seed values of one summary key for one recipe."""
    return {seed: s[key] for seed, s in table.get(name, {}).items()}
