"""Statistics over seeds: bootstrap intervals, paired differences, per-step bands, smoothing.

Pure functions over numpy arrays; no state, fixed random generators, so the same numbers give
the same intervals every time.

Percentile bootstrap of the mean (Efron): with seeds' values x_1..x_n, draw B resamples
x*_b = (x_{i_b1}, ..., x_{i_bn}), i uniform on 1..n with replacement, take m_b = mean(x*_b);
the 95 % interval is the 2.5th and 97.5th percentiles of m_1..m_B (numpy's linear
interpolation). Paired by seed (the same seeds ran in both recipes): d_i = y_i - x_i per seed,
then the bootstrap of mean(d). Unpaired: resample each side on its own, m_b = mean(y*_b) -
mean(x*_b). With one value there is no interval (NaN bounds): one run says nothing about
seed-to-seed spread. The percentile interval can be no wider than the range of the values and
covers less than 95 % for small n (with n = 2 it *is* the range): 3 seeds are the minimum for a
verdict, 5 or more make the interval trustworthy.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95
RNG_SEED = 20_240_615


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval (NaN bounds when `n` < 2)."""

    estimate: float
    low: float
    high: float
    n: int

    @property
    def has_interval(self) -> bool:
        return self.n >= 2 and bool(np.isfinite(self.low) and np.isfinite(self.high))

    def contains(self, value: float) -> bool:
        """True when `low <= value <= high` (False without an interval)."""
        return self.has_interval and self.low <= value <= self.high

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. x100 for accuracy points)."""
        return Interval(self.estimate * factor, self.low * factor, self.high * factor, self.n)


def _finite(values: np.ndarray | list[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]


def _percentiles(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return float(low), float(high)


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = RNG_SEED) -> np.ndarray:
    """`resamples` x `n` indices drawn uniformly from 0..n-1 with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_mean(
    values: np.ndarray | list[float],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = RNG_SEED,
) -> Interval:
    """Mean of the finite `values` and its percentile-bootstrap interval (see module docstring)."""
    x = _finite(values)
    if x.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if x.size == 1:
        return Interval(float(x[0]), float("nan"), float("nan"), 1)
    draws = x[resample_indices(x.size, resamples, seed)].mean(axis=1)
    return Interval(float(x.mean()), *_percentiles(draws, confidence), int(x.size))


def paired_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    """Seeds with a finite value on both sides, sorted."""
    return sorted(s for s in set(a) & set(b) if np.isfinite(a[s]) and np.isfinite(b[s]))


def difference(
    a: Mapping[int, float],
    b: Mapping[int, float],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = RNG_SEED,
) -> tuple[Interval, bool]:
    """mean(b) - mean(a) over seeds, with its interval; returns (interval, paired).

    Paired by seed when two or more seeds have values on both sides (d_s = b_s - a_s, bootstrap
    of mean(d) over those seeds); otherwise the unpaired bootstrap over each side's values.
    """
    common = paired_seeds(a, b)
    if len(common) >= 2:
        return bootstrap_mean([b[s] - a[s] for s in common], resamples, confidence, seed), True
    x, y = _finite(list(a.values())), _finite(list(b.values()))
    if not x.size or not y.size:
        return Interval(float("nan"), float("nan"), float("nan"), 0), False
    estimate = float(y.mean() - x.mean())
    n = min(x.size, y.size)
    if x.size < 2 or y.size < 2:
        return Interval(estimate, float("nan"), float("nan"), n), False
    draws = y[resample_indices(y.size, resamples, seed + 1)].mean(axis=1) - x[
        resample_indices(x.size, resamples, seed)
    ].mean(axis=1)
    return Interval(estimate, *_percentiles(draws, confidence), n), False


def ratio(
    a: Mapping[int, float],
    b: Mapping[int, float],
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = RNG_SEED,
) -> Interval:
    """mean(b) / mean(a) over seeds and its percentile-bootstrap interval.

    Paired seeds (two or more) are resampled together (the same indices on both sides), others
    independently. Resamples whose mean(a) is 0 are dropped; NaN when a's mean is 0.
    """
    common = paired_seeds(a, b)
    if len(common) >= 2:
        x, y = np.array([a[s] for s in common]), np.array([b[s] for s in common])
        ix = iy = resample_indices(len(common), resamples, seed)
    else:
        x, y = _finite(list(a.values())), _finite(list(b.values()))
        if not x.size or not y.size or x.mean() == 0:
            return Interval(float("nan"), float("nan"), float("nan"), 0)
        ix = resample_indices(x.size, resamples, seed)
        iy = resample_indices(y.size, resamples, seed + 1)
    if x.mean() == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    estimate = float(y.mean() / x.mean())
    n = min(x.size, y.size)
    if x.size < 2 or y.size < 2:
        return Interval(estimate, float("nan"), float("nan"), n)
    den = x[ix].mean(axis=1)
    keep = den != 0
    draws = y[iy].mean(axis=1)[keep] / den[keep]
    return Interval(estimate, *_percentiles(draws, confidence), n)


def band(
    table: np.ndarray,
    resamples: int = 2_000,
    confidence: float = CONFIDENCE,
    seed: int = RNG_SEED,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step, the mean over seeds and its bootstrap interval: `table[seed, step]` -> (mean,
    low, high), each of length `steps`. NaN entries (a seed without that step) are left out of
    that step; steps with fewer than two seeds get NaN bounds."""
    table = np.atleast_2d(np.asarray(table, dtype=np.float64))
    present = np.isfinite(table)
    count = present.sum(axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.where(count > 0, np.nansum(table, axis=0) / np.maximum(count, 1), np.nan)
    low = np.full(mean.shape, np.nan)
    high = np.full(mean.shape, np.nan)
    if table.shape[0] >= 2:
        idx = resample_indices(table.shape[0], resamples, seed)
        sample = table[idx]  # (resamples, seeds, steps)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # resamples that miss a step
            draws = np.nanmean(sample, axis=1)
            tail = 100.0 * (1.0 - confidence) / 2.0
            low, high = np.nanpercentile(draws, [tail, 100.0 - tail], axis=0)
        low = np.where(count >= 2, low, np.nan)
        high = np.where(count >= 2, high, np.nan)
    return mean, low, high


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


def format_interval(interval: Interval, template: str = "{:.3f}") -> str:
    """`0.512 [0.488, 0.540]`; just the estimate without an interval; `-` when there is none."""
    if not np.isfinite(interval.estimate):
        return "-"
    text = template.format(interval.estimate)
    if interval.has_interval:
        text += f" [{template.format(interval.low)}, {template.format(interval.high)}]"
    return text
