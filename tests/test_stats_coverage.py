"""Coverage of the intervals over seeds (`analysis.stats`) at the 95 % level, in simulation.

For n = 3, 5 and 10 "seeds", 20,000 draws (fixed generator) from a distribution with a known
mean; the share of draws whose interval holds that mean is the coverage. Data: normal, and
skewed (gamma with shape 4: skewness 1, the shape of per-seed shares and accuracies that sit
near a floor). The primary interval must cover ≥ 0.93; the percentile bootstrap at n = 3 is
measured too, to show that the simulation does catch an interval that is too short.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nemo_fp8_rl.analysis import stats

DRAWS = 20_000
SETTINGS = {
    "normal": (lambda rng, size: rng.normal(0.4, 0.05, size), 0.4),
    "skewed": (lambda rng, size: rng.gamma(4.0, 0.01, size), 0.04),
}


def _t_coverage(draws: np.ndarray, truth: float) -> float:
    """Vectorised Student-t intervals over the rows of `draws`, as `stats.mean_interval`."""
    n = draws.shape[1]
    mean, sd = draws.mean(1), draws.std(1, ddof=1)
    half = stats.t_quantile(0.95, n - 1) * sd / math.sqrt(n)
    return float(((mean - half <= truth) & (truth <= mean + half)).mean())


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("n", [3, 5, 10])
def test_t_interval_of_a_mean_covers(setting, n):
    draw, truth = SETTINGS[setting]
    rng = np.random.default_rng(100 * n + len(setting))
    data = draw(rng, (DRAWS, n))
    assert _t_coverage(data, truth) >= 0.93
    # the vectorised check is the library's interval: spot-check a few rows
    for row in data[:5]:
        iv = stats.mean_interval(row)
        expected = _t_coverage(row[None, :], truth) == 1.0
        assert (iv.low <= truth <= iv.high) == expected and iv.n == n and iv.method == "t"


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_difference_covers(setting, n):
    """b_s = a_s + shift + noise_s with a seed effect shared by both recipes."""
    draw, truth = SETTINGS[setting]
    rng = np.random.default_rng(200 * n + len(setting))
    seed_effect = rng.normal(0.0, 0.2, (DRAWS, n))  # large, cancels in the pairing
    noise = draw(rng, (DRAWS, n)) - truth
    a = seed_effect
    b = seed_effect - 0.02 + noise
    assert _t_coverage(b - a, -0.02) >= 0.93
    iv, paired = stats.difference(dict(enumerate(a[0])), dict(enumerate(b[0])))
    assert paired and iv.method == "paired t" and iv.estimate == pytest.approx((b[0] - a[0]).mean())


@pytest.mark.parametrize("n", [3, 5, 10])
def test_fieller_ratio_covers(n):
    """Quotient of means of two positive per-seed measures, paired, normal noise."""
    rng = np.random.default_rng(300 + n)
    hits = 0
    draws = 4_000
    for _ in range(draws):
        a = rng.normal(1.0, 0.15, n)
        b = 2.0 * a + rng.normal(0.0, 0.3, n)
        iv = stats.ratio(dict(enumerate(a)), dict(enumerate(b)))
        hits += iv.low <= 2.0 <= iv.high
    assert hits / draws >= 0.93


def test_log_ratio_covers_the_geometric_quotient():
    rng = np.random.default_rng(7)
    hits, draws = 0, 4_000
    for _ in range(draws):
        a = rng.lognormal(-7.0, 0.6, 5)
        b = a * np.exp(rng.normal(math.log(8.0), 0.5, 5))
        iv = stats.log_ratio(dict(enumerate(a)), dict(enumerate(b)))
        hits += iv.low <= 8.0 <= iv.high
    assert hits / draws >= 0.93


def test_the_simulation_catches_the_short_bootstrap_interval():
    draw, truth = SETTINGS["normal"]
    rng = np.random.default_rng(5)
    hits = sum(
        stats.bootstrap_mean(row, resamples=500).contains(truth) for row in draw(rng, (2_000, 3))
    )
    assert hits / 2_000 < 0.85  # measured ≈ 0.75: the percentile bootstrap at n = 3
