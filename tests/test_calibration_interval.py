"""Coverage of the L* interval (`calibration.order_interval`) in simulation, and the pool's rule.

Simulation: n negative-advantage tokens with BF16 ratios r and FP8 ratios r̃ from known
distributions, so the true L* — the p-quantile of r̃ with p = P(r < L0) — is known in closed
form. The expected number of BF16-clipped tokens n·p is set to 1, 5, 13 and 50; for each, 2,000
draws (fixed generator) count how often the 90 % interval holds the true L*. Two settings:
correlated log-normal ratios (r̃ = r·FP8 noise, the realistic case) and independent skewed
ratios (exponential tails, the worst case for the interval's argument). A deliberately narrow
interval, `[x_(m), x_(m+2)]`, is measured alongside to show that the simulation can fail.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from nemo_fp8_rl.calibration.bounds import lower_target
from nemo_fp8_rl.calibration.lower_pool import LowerPool
from nemo_fp8_rl.calibration.order_interval import (
    binomial_half_cdf,
    count_range,
    lower_target_interval,
)

L0 = 0.8
N = 4000
DRAWS = 2000


def _correlated(p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """log r ~ N(0, σ²) with P(r < L0) = p; log r̃ = log r + N(0, σ²); true L* in closed form."""
    z = NormalDist().inv_cdf(p)
    sigma = math.log(L0) / z
    log_r = rng.normal(0.0, sigma, N)
    log_rt = log_r + rng.normal(0.0, sigma, N)
    return np.exp(log_rt), np.exp(log_r), math.exp(math.sqrt(2.0) * sigma * z)


def _skewed(p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """log r = −θ·E, log r̃ = 0.05 − 2θ·E' (E, E' independent Exp(1)): P(r < L0) = p."""
    theta = math.log(L0) / math.log(p)
    log_r = -theta * rng.exponential(1.0, N)
    log_rt = 0.05 - 2.0 * theta * rng.exponential(1.0, N)
    return np.exp(log_rt), np.exp(log_r), math.exp(0.05 + 2.0 * theta * math.log(p))


def coverage(expected_m: float, setting, narrow: bool = False) -> float:
    """Share of draws whose 90 % interval (or the narrow one) holds the true L*."""
    rng = np.random.default_rng(int(expected_m * 1000) + (7 if setting is _skewed else 0))
    ranges: dict[int, tuple[int, int]] = {}
    hits = 0
    for _ in range(DRAWS):
        fp8, bf16, truth = setting(expected_m / N, rng)
        m = int((bf16 < L0).sum())
        xs = np.sort(fp8)
        if narrow:
            lo = xs[m - 1] if m >= 1 else 0.0
            hi = xs[min(m + 1, N - 1)]
        else:
            k_lo, k_hi = ranges.setdefault(m, count_range(m, N, 0.9))
            lo = xs[k_lo - 1] if k_lo >= 1 else 0.0
            hi = xs[k_hi] if k_hi < N else math.inf
        hits += lo <= truth <= hi
    return hits / DRAWS


@pytest.mark.parametrize("setting", [_correlated, _skewed], ids=["correlated", "skewed"])
@pytest.mark.parametrize("expected_m", [1, 5, 13, 50])
def test_interval_covers_the_true_lower_target(expected_m, setting):
    assert coverage(expected_m, setting) >= 0.88


@pytest.mark.parametrize("expected_m", [5, 50])
def test_the_simulation_detects_an_interval_that_is_too_narrow(expected_m):
    assert coverage(expected_m, _skewed, narrow=True) < 0.6


def test_binomial_half_cdf_matches_direct_sums():
    for s in (1, 7, 40):
        for k in range(s + 1):
            direct = sum(math.comb(s, i) for i in range(k + 1)) / 2**s
            assert binomial_half_cdf(k, s) == pytest.approx(direct, rel=1e-9)
    # beyond the exact range (s > 4000) the normal approximation is within 1e-3 of the exact sum
    s = 4001
    for k in (1900, 1960, 2000):
        exact = sum(math.comb(s, i) for i in range(k + 1)) / 2**s
        assert binomial_half_cdf(k, s) == pytest.approx(exact, abs=1e-3)


def test_count_range_known_values():
    # m = 1: K ≤ 6 since P(Bin(8, ½) ≤ 1) = 9/256 < 0.05 ≤ P(Bin(7, ½) ≤ 1) = 8/128
    assert count_range(1, 10_000) == (0, 6)
    assert count_range(0, 10_000) == (0, 4)  # P(Bin(5, ½) = 0) = 1/32 < 0.05
    lo, hi = count_range(50, 10_000)
    assert lo < 50 < hi and hi - lo < 40
    assert count_range(3, 3) == (count_range(3, 3)[0], 3)  # K cannot exceed n


def test_interval_brackets_the_estimate_and_is_open_above_when_values_run_out():
    xs = torch.linspace(0.5, 1.0, 101)
    iv = lower_target_interval(xs, 5, 101)
    assert iv.lo <= float(xs[5]) <= iv.hi
    assert lower_target_interval(xs[:8], 5, 101).hi == math.inf
    assert math.isnan(lower_target_interval(xs[:0], 0, 0).lo)


def _window(rng: torch.Generator, clipped: int, n: int = 500):
    """N⁻ ratios of one window with exactly `clipped` BF16 ratios below L0."""
    bf16 = 0.9 + 0.2 * torch.rand(n, generator=rng, dtype=torch.float64)
    bf16[:clipped] = 0.7
    fp8 = bf16 * torch.exp(0.05 * torch.randn(n, generator=rng, dtype=torch.float64))
    return fp8, bf16


def test_pool_reaches_back_until_enough_clipped_tokens():
    rng = torch.Generator().manual_seed(0)
    pool = LowerPool(L0, min_clipped=16, max_windows=16, rule="until_min_clipped")
    windows = [_window(rng, 2) for _ in range(10)]
    for step, (fp8, bf16) in enumerate(windows):
        pool.add(step, fp8, bf16)
    got = pool.target()
    assert (got.windows, got.clipped, got.weight) == (8, 16, 1.0)  # 8 windows x 2 >= 16
    fp8 = torch.cat([w[0] for w in windows[2:]])
    bf16 = torch.cat([w[1] for w in windows[2:]])
    assert got.low_target == lower_target(fp8, bf16, L0)[0]  # as if one window of 4,000 tokens
    assert got.interval.lo <= got.low_target <= got.interval.hi


def test_pool_keeps_one_window_when_it_clips_enough_and_caps_its_length():
    rng = torch.Generator().manual_seed(1)
    pool = LowerPool(L0, min_clipped=16, max_windows=4, rule="until_min_clipped")
    for step in range(6):
        pool.add(step, *_window(rng, 1))
    assert pool.target().windows == 4 and pool.target().weight == 4 / 16
    fp8, bf16 = _window(rng, 40)
    pool.add(6, fp8, bf16)
    got = pool.target()
    assert (got.windows, got.clipped) == (1, 40)
    assert got.low_target == lower_target(fp8, bf16, L0)[0]
    single = LowerPool(L0, min_clipped=0, max_windows=16, rule="until_min_clipped")  # per window
    for step in range(3):
        single.add(step, *_window(rng, 2))
    assert (single.target().windows, single.target().weight) == (1, 1.0)


@pytest.mark.parametrize("rule", ["fixed_windows", "until_min_clipped"])
def test_pool_state_round_trips_and_stays_small(rule):
    rng = torch.Generator().manual_seed(2)
    pool = LowerPool(L0, min_clipped=16, max_windows=16, rule=rule)
    for step in range(5):
        pool.add(step, *_window(rng, 1, n=20_000))
    state = pool.state_dict()
    assert all(len(w["smallest"]) <= 1 + 16 * 16 + 64 for w in state)
    again = LowerPool(L0, min_clipped=16, max_windows=16, rule=rule)
    again.load_state_dict(state)
    assert again.target() == pool.target()
    for p in (pool, again):  # the first window's handling survives the round trip
        p.add(5, *_window(torch.Generator().manual_seed(3), 1, n=20_000))
    assert again.target() == pool.target() and again.added == pool.added == 6
