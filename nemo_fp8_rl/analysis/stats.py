"""Statistics over seeds: Student-t intervals (primary), paired differences, ratios, bands.

Pure functions over numpy arrays, no state: the same numbers give the same intervals every time.

Primary interval of a mean over seeds (Student-t): with values x_1..x_n,

    mean ± t_{n-1, (1+c)/2} · s / √n,     s² = Σ (x_i − mean)² / (n − 1).

It assumes the seed means are roughly normal; with few seeds it is wide, as it should be.
`tests/test_stats_coverage.py` measures its coverage at the 95 % level in simulation: ≥ 0.95 on
normal data and ≈ 0.935 on skewed data (gamma, shape 4, skewness 1) at n = 3, 5 and 10; on
more skewed data it drops (gamma shape 2: ≈ 0.92; exponential: ≈ 0.88–0.90). The percentile
bootstrap, by contrast, covers ≈ 0.75 at n = 3 (it cannot be wider than the values' range),
so it is kept only as a labelled secondary (`bootstrap_mean`), for n ≥ 10.

Differences between recipes (`difference`): paired by seed when two or more seeds ran in both
(d_s = b_s − a_s, the t-interval of mean(d)); otherwise Welch's interval with the
Welch–Satterthwaite degrees of freedom rounded down. Quotients of means (`ratio`, e.g. FP8 ÷
BF16 clip share): Fieller's interval, {ρ : (ȳ − ρ·x̄)² ≤ t² · Var(ȳ − ρ·x̄)}, with the
per-seed covariance when paired; it is unbounded (±inf) when the denominator's mean is not
clearly away from zero, which is what the data say then. One value gives no interval (NaN
bounds). Every interval carries its n and method, and `format_interval` prints n beside it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
RNG_SEED = 20_240_615
NAN = float("nan")


@dataclass(frozen=True)
class Interval:
    """A point estimate, its interval (NaN bounds when `n` < 2), n and the method."""

    estimate: float
    low: float
    high: float
    n: int
    method: str = "t"

    @property
    def has_interval(self) -> bool:
        return self.n >= 2 and not (math.isnan(self.low) or math.isnan(self.high))

    def contains(self, value: float) -> bool:
        """True when `low <= value <= high` (False without an interval)."""
        return self.has_interval and self.low <= value <= self.high

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. x100 for accuracy points); factor > 0."""
        return Interval(
            self.estimate * factor, self.low * factor, self.high * factor, self.n, self.method
        )


def _finite(values: np.ndarray | list[float]) -> np.ndarray:
    array = np.asarray([np.nan if v is None else v for v in np.ravel(values)], dtype=np.float64)
    return array[np.isfinite(array)]


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with integer `df` ≥ 1 (closed form, Abramowitz–Stegun 26.7.3–4).

    θ = atan(t/√ν); ν odd: (2/π)(θ + sinθ·cosθ·Σ_{k<(ν−1)/2} a_k cos^{2k}θ), a_0 = 1,
    a_k = a_{k−1}·2k/(2k+1); ν even: sinθ·Σ_{k<ν/2} b_k cos^{2k}θ, b_0 = 1, b_k = b_{k−1}(2k−1)/(2k).
    """
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * 2 * k / (2 * k + 1)
            total += term
        return (2 / math.pi) * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(confidence: float, df: int) -> float:
    """t_{df, (1+confidence)/2}: the half-width factor of a two-sided `confidence` interval."""
    if not 0.0 < confidence < 1.0 or df < 1:
        raise ValueError(f"t_quantile: need 0 < confidence < 1 and df >= 1, got {confidence}, {df}")
    low, high = 0.0, 1.0
    while t_cdf_two_sided(high, df) < confidence:
        high *= 2.0
    for _ in range(200):  # bisection to float precision
        mid = 0.5 * (low + high)
        low, high = (mid, high) if t_cdf_two_sided(mid, df) < confidence else (low, mid)
    return high


def mean_interval(values: np.ndarray | list[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of the finite `values` and its Student-t interval (see the module docstring)."""
    x = _finite(values)
    if x.size == 0:
        return Interval(NAN, NAN, NAN, 0)
    if x.size == 1:
        return Interval(float(x[0]), NAN, NAN, 1)
    half = t_quantile(confidence, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    mean = float(x.mean())
    return Interval(mean, mean - half, mean + half, int(x.size))


def paired_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """Seeds with a finite value on both sides, sorted."""
    return sorted(s for s in set(a) & set(b) if np.isfinite(a[s]) and np.isfinite(b[s]))


def difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> tuple[Interval, bool]:
    """mean(b) − mean(a) over seeds, with its interval; returns (interval, paired).

    Paired by seed when two or more seeds have values on both sides (t-interval of the
    per-seed differences, method `paired t`); otherwise Welch's interval (method `Welch t`).
    """
    common = paired_seeds(a, b)
    if len(common) >= 2:
        iv = mean_interval([b[s] - a[s] for s in common], confidence)
        return Interval(iv.estimate, iv.low, iv.high, iv.n, "paired t"), True
    x, y = _finite(list(a.values())), _finite(list(b.values()))
    if not x.size or not y.size:
        return Interval(NAN, NAN, NAN, 0), False
    estimate, n = float(y.mean() - x.mean()), int(min(x.size, y.size))
    if x.size < 2 or y.size < 2:
        return Interval(estimate, NAN, NAN, n, "Welch t"), False
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    if vx + vy == 0:
        return Interval(estimate, estimate, estimate, n, "Welch t"), False
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    half = t_quantile(confidence, max(1, int(df))) * math.sqrt(vx + vy)
    return Interval(estimate, estimate - half, estimate + half, n, "Welch t"), False


def ratio(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> Interval:
    """mean(b) / mean(a) over seeds and its Fieller interval (paired when two or more seeds
    have both values; NaN when a's mean is 0; ±inf bounds when the interval is unbounded)."""
    common = paired_seeds(a, b)
    if len(common) >= 2:
        x, y = np.array([a[s] for s in common]), np.array([b[s] for s in common])
        n = x.size
        vxx, vyy = x.var(ddof=1) / n, y.var(ddof=1) / n
        vxy = float(np.cov(x, y, ddof=1)[0, 1]) / n
        df, method = n - 1, "Fieller, paired"
    else:
        x, y = _finite(list(a.values())), _finite(list(b.values()))
        if not x.size or not y.size:
            return Interval(NAN, NAN, NAN, 0)
        n = int(min(x.size, y.size))
        vxx = x.var(ddof=1) / x.size if x.size > 1 else NAN
        vyy = y.var(ddof=1) / y.size if y.size > 1 else NAN
        vxy, df, method = 0.0, n - 1, "Fieller"
    if x.mean() == 0:
        return Interval(NAN, NAN, NAN, 0, method)
    estimate = float(y.mean() / x.mean())
    if n < 2:
        return Interval(estimate, NAN, NAN, n, method)
    return Interval(
        estimate, *_fieller(x.mean(), y.mean(), vxx, vyy, vxy, df, confidence), n, method
    )


def log_ratio(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> Interval:
    """Geometric mean over paired seeds of b_s / a_s, with the t-interval of the log quotients
    exponentiated (method `t of log quotients`). Needs both values > 0 for a seed; NaN without
    two such seeds. For shares that differ by a factor (e.g. FP8 ÷ BF16 clip share per seed),
    where the quotient of means is dominated by the seed with the largest values."""
    common = [s for s in paired_seeds(a, b) if a[s] > 0 and b[s] > 0]
    if not common:
        return Interval(NAN, NAN, NAN, 0, "t of log quotients")
    iv = mean_interval([math.log(b[s] / a[s]) for s in common], confidence)
    return Interval(
        math.exp(iv.estimate),
        math.exp(iv.low) if iv.has_interval else NAN,
        math.exp(iv.high) if iv.has_interval else NAN,
        iv.n,
        "t of log quotients",
    )


def _fieller(mx, my, vxx, vyy, vxy, df, confidence) -> tuple[float, float]:
    """Ends of {ρ : (my − ρ·mx)² ≤ t²·(vyy − 2ρ·vxy + ρ²·vxx)}; (−inf, inf) when unbounded."""
    t2 = t_quantile(confidence, df) ** 2
    qa, qb, qc = mx * mx - t2 * vxx, mx * my - t2 * vxy, my * my - t2 * vyy
    if qa <= 0:
        return -math.inf, math.inf
    # with qa > 0 the set holds my/mx, so the discriminant is ≥ 0 up to rounding
    root = math.sqrt(max(qb * qb - qa * qc, 0.0))
    return float((qb - root) / qa), float((qb + root) / qa)


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = RNG_SEED) -> np.ndarray:
    """`resamples` x `n` indices drawn uniformly from 0..n-1 with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_mean(
    values: np.ndarray | list[float],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = RNG_SEED,
) -> Interval:
    """Secondary: mean and percentile-bootstrap interval (method `bootstrap`; use for n ≥ 10).

    Resample the values with replacement B times, take the 2.5th/97.5th percentiles of the
    resample means (numpy's linear interpolation). It cannot be wider than the values' range,
    so with few seeds it undercovers (module docstring).
    """
    x = _finite(values)
    if x.size == 0:
        return Interval(NAN, NAN, NAN, 0, "bootstrap")
    if x.size == 1:
        return Interval(float(x[0]), NAN, NAN, 1, "bootstrap")
    draws = x[resample_indices(x.size, resamples, seed)].mean(axis=1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return Interval(float(x.mean()), float(low), float(high), int(x.size), "bootstrap")


def band(
    table: np.ndarray, confidence: float = CONFIDENCE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step, the mean over seeds and its t-interval: `table[seed, step]` -> (mean, low,
    high). NaN entries (a seed without that step) are left out of that step; steps with fewer
    than two seeds get NaN bounds."""
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    count = np.isfinite(table).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps with no or one value
        mean = np.where(count > 0, np.nanmean(table, axis=0), np.nan)
        sd = np.nanstd(table, axis=0, ddof=1)
    factor = np.array([t_quantile(confidence, int(k) - 1) if k >= 2 else np.nan for k in count])
    half = factor * sd / np.sqrt(np.maximum(count, 1))
    return mean, mean - half, mean + half


def ema(values: np.ndarray, alpha: float) -> np.ndarray:
    """Exponential moving average s_t = alpha * x_t + (1 - alpha) * s_{t-1}, s_0 = x_0.

    NaN points are skipped (the average carries over them and they stay NaN in the output).
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"EMA alpha must be in (0, 1], got {alpha}")
    x = np.asarray(values, dtype=np.float64)
    out = np.full(x.shape, np.nan)
    state = np.nan
    for i, v in enumerate(x):
        if np.isfinite(v):
            state = v if not np.isfinite(state) else alpha * v + (1.0 - alpha) * state
            out[i] = state
    return out


def format_interval(interval: Interval, template: str = "{:.3f}", with_n: bool = True) -> str:
    """`0.512 [0.488, 0.540] (n=5)`; the estimate alone (with n) without an interval; `-`."""
    if not np.isfinite(interval.estimate):
        return "-"
    text = template.format(interval.estimate)
    if interval.has_interval:
        text += f" [{_end(interval.low, template)}, {_end(interval.high, template)}]"
    return text + (f" (n={interval.n})" if with_n else "")


def _end(value: float, template: str) -> str:
    return template.format(value) if math.isfinite(value) else ("∞" if value > 0 else "−∞")
