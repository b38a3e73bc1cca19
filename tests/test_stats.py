"""Intervals over seeds against cases whose answer is known without the code (Student-t,
Welch, Fieller; the secondary percentile bootstrap). Coverage: `test_stats_coverage.py`."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nemo_fp8_rl.analysis import stats


def exact_bootstrap_quantiles(x: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval of the *exact* bootstrap distribution of the mean: every one of
    the n^n equally likely resamples enumerated, no random numbers."""
    means = np.sort([np.mean(r) for r in itertools.product(x, repeat=len(x))])
    tail = (1 - confidence) / 2
    k = len(means)
    return float(means[int(np.floor(tail * k))]), float(means[int(np.ceil((1 - tail) * k)) - 1])


def test_all_equal_values_give_a_zero_width_interval():
    iv = stats.bootstrap_mean([0.25, 0.25, 0.25, 0.25])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (0.25, 0.25, 0.25, 4)
    assert iv.contains(0.25) and not iv.contains(0.2501)


def test_percentile_bootstrap_matches_the_exact_bootstrap_distribution():
    x = [0.1, 0.4, 0.45, 0.9, 1.3]  # 5^5 = 3125 resamples enumerated by hand
    low, high = exact_bootstrap_quantiles(x)
    iv = stats.bootstrap_mean(x, resamples=100_000)
    assert iv.estimate == pytest.approx(np.mean(x))
    # Monte-Carlo error of a 2.5 % quantile with 1e5 draws is well under 0.01 here
    assert iv.low == pytest.approx(low, abs=0.012) and iv.high == pytest.approx(high, abs=0.012)


def test_percentile_convention_by_hand():
    """Four resamples of [0, 1, 3] drawn from the documented generator; the interval's ends are
    numpy's linear-interpolation percentiles of those four means, computed here step by step."""
    x = np.array([0.0, 1.0, 3.0])
    idx = np.random.default_rng(7).integers(0, 3, size=(4, 3))
    means = np.sort(x[idx].mean(axis=1))
    # percentile p of 4 sorted points: position h = (4 - 1) * p / 100, interpolate around h
    h_low, h_high = 3 * 0.025, 3 * 0.975
    low = means[0] + h_low * (means[1] - means[0])
    high = means[2] + (h_high - 2) * (means[3] - means[2])
    iv = stats.bootstrap_mean(x, resamples=4, seed=7)
    assert (iv.low, iv.high) == pytest.approx((low, high))


def test_paired_constant_difference_is_exact_unpaired_is_not():
    a = {1: 0.10, 2: 0.50, 3: 0.90}
    b = {s: v - 0.05 for s, v in a.items()}
    paired, is_paired = stats.difference(a, b)
    assert is_paired and paired.estimate == pytest.approx(-0.05)
    assert (paired.low, paired.high) == pytest.approx((-0.05, -0.05))
    assert not paired.contains(0.0)
    shifted = {s + 10: v for s, v in b.items()}  # other seeds: nothing to pair
    unpaired, is_paired = stats.difference(a, shifted)
    assert not is_paired and unpaired.estimate == pytest.approx(-0.05)
    assert unpaired.low < -0.3 and unpaired.high > 0.2 and unpaired.contains(0.0)


def test_one_value_has_no_interval():
    iv = stats.bootstrap_mean([0.7, float("nan")])
    assert iv.estimate == 0.7 and iv.n == 1 and not iv.has_interval and not iv.contains(0.7)
    assert stats.format_interval(iv) == "0.700 (n=1)"
    diff, paired = stats.difference({1: 0.5}, {1: 0.4})
    assert diff.estimate == pytest.approx(-0.1) and not diff.has_interval and not paired
    assert stats.format_interval(stats.bootstrap_mean([])) == "-"


def test_ratio_paired_constant_and_zero_reference():
    a = {1: 1.0, 2: 1.1, 3: 0.9}
    b = {s: 2.5 * v for s, v in a.items()}
    iv = stats.ratio(a, b)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((2.5, 2.5, 2.5))
    assert iv.method == "Fieller, paired" and iv.n == 3
    assert np.isnan(stats.ratio({1: 0.0, 2: 0.0}, {1: 1.0, 2: 1.0}).estimate)
    # a denominator whose mean is not clearly above 0 (t-interval of it holds 0): unbounded
    shaky = stats.ratio({1: 0.0005, 2: 0.0005, 3: 0.002}, {1: 0.013, 2: 0.019, 3: 0.017})
    assert (shaky.low, shaky.high) == (-np.inf, np.inf)
    assert stats.format_interval(shaky, "{:.1f}") == "16.3 [−∞, ∞] (n=3)"


def test_t_quantiles_and_the_mean_interval_by_hand():
    for df, table in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452)):
        assert stats.t_quantile(0.95, df) == pytest.approx(table, abs=1e-4)
    iv = stats.mean_interval([1.0, 2.0, 3.0])  # mean 2, s = 1: 2 ± 4.3027/√3
    assert (iv.estimate, iv.n, iv.method) == (2.0, 3, "t")
    half = 4.302652729749464 / 3**0.5
    assert (iv.low, iv.high) == pytest.approx((2 - half, 2 + half))
    assert stats.format_interval(iv) == "2.000 [-0.484, 4.484] (n=3)"


def test_log_ratio_is_the_geometric_mean_of_per_seed_quotients():
    a, b = {1: 0.001, 2: 0.002, 3: 0.004}, {1: 0.01, 2: 0.04, 3: 0.04}
    iv = stats.log_ratio(a, b)
    assert iv.estimate == pytest.approx((10 * 20 * 10) ** (1 / 3)) and iv.n == 3
    assert iv.low < iv.estimate < iv.high


def test_band_per_step():
    table = np.array([[1.0, 2.0, np.nan], [1.0, 4.0, 5.0], [1.0, 6.0, np.nan]])
    mean, low, high = stats.band(table)
    assert mean == pytest.approx([1.0, 4.0, 5.0])
    assert (low[0], high[0]) == (1.0, 1.0)  # all seeds equal: zero width
    half = stats.t_quantile(0.95, 2) * 2.0 / 3**0.5  # values 2, 4, 6: s = 2, n = 3
    assert (low[1], high[1]) == pytest.approx((4.0 - half, 4.0 + half))
    assert np.isnan(low[2]) and np.isnan(high[2])  # one seed at that step: no interval


def test_ema():
    out = stats.ema(np.array([1.0, np.nan, 3.0, 3.0]), 0.5)
    assert out[0] == 1.0 and np.isnan(out[1]) and out[2] == 2.0 and out[3] == 2.5
    with pytest.raises(ValueError, match="alpha"):
        stats.ema(np.ones(3), 0.0)
