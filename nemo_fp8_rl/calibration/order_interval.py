"""A distribution-free interval for the quantile-matched lower bound L*.

The target: `ℓ`, the value below which the FP8 ratio r̃ falls as often as the BF16 ratio r falls
below L0, i.e. the p-quantile of r̃ with p = P(r < L0). The estimate (`bounds.lower_target`):
with n negative-advantage tokens, m = #{r < L0} and the FP8 ratios ordered x_(1) ≤ … ≤ x_(n),
`L* = x_(m+1)`. Two counts carry all the sampling noise:

    m = #{r < L0} ~ Binomial(n, p)          K = #{r̃ < ℓ} ~ Binomial(n, p)

and `x_(K) < ℓ ≤ x_(K+1)` (continuous ratios). So any set `[K_lo, K_hi]` that holds K with
probability ≥ level gives `ℓ ∈ [x_(K_lo), x_(K_hi+1)]` with at least that probability
(x_(0) = 0: ratios are positive). K is predicted from m by inverting the conditional test of
equal rates: given S = m + K, m is hypergeometric when the two counts are independent, and
Binomial(S, 1/2) is more dispersed than that, so

    K_hi = max{K : P(Bin(m + K, 1/2) ≤ m) > a/2},   K_lo = min{K : P(Bin(m + K, 1/2) ≥ m) > a/2},

a = 1 − level, covers K with probability ≥ level whatever the distributions of r and r̃.
Independence is the worst case: FP8 and BF16 ratios of the same token are positively
correlated, which brings K closer to m. Why not the bootstrap: with few clipped tokens (m of
1–13) resampling a handful of order statistics undercovers badly (measured 0.38 at m ≈ 1); the
interval here is wide there because L* is that uncertain (at m = 1 it spans x_(0) … x_(7)).
The simulation in `tests/test_calibration_interval.py` checks coverage at m = 1, 5, 13, 50.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

EXACT_UP_TO = 4000


class LowerInterval(NamedTuple):
    """Interval `[lo, hi]` of L* (order statistics `x_(k_lo)`, `x_(k_hi+1)`) and the K range."""

    lo: float
    hi: float
    k_lo: int
    k_hi: int


def binomial_half_cdf(k: int, s: int) -> float:
    """P(Bin(s, 1/2) ≤ k): summed in log space up to s = 4000, the normal approximation with
    continuity correction beyond (there its error is below 1e-3, far under the tail 0.05)."""
    if k < 0:
        return 0.0
    if k >= s:
        return 1.0
    if s > EXACT_UP_TO:
        return 0.5 * math.erfc(-(k + 0.5 - s / 2) / (math.sqrt(s) / 2) / math.sqrt(2.0))
    head = math.lgamma(s + 1) - s * math.log(2.0)
    logs = [head - math.lgamma(i + 1) - math.lgamma(s - i + 1) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


@functools.lru_cache(maxsize=4096)
def count_range(m: int, n: int, level: float = 0.9) -> tuple[int, int]:
    """`(K_lo, K_hi)`: the counts K = #{r̃ < ℓ} not rejected against the observed m (module);
    a pure function of its arguments, cached (calibration repeats the same counts)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"count_range: level must be in (0, 1), got {level}")
    if not 0 <= m <= n:
        raise ValueError(f"count_range: need 0 <= m <= n, got m = {m}, n = {n}")
    tail = (1.0 - level) / 2.0
    # both conditions are monotone in K: bisect for the last K that passes each test
    k_hi = _last_true(lambda k: binomial_half_cdf(m, m + k) > tail, m, n)
    k_lo = m - _last_true(lambda d: 1.0 - binomial_half_cdf(m - 1, 2 * m - d) > tail, 0, m)
    return k_lo, k_hi


def _last_true(ok, start: int, stop: int) -> int:
    """Largest k in [start, stop] with ok(k), for ok true at `start` and monotone (true, then false)."""
    low, high = start, stop
    while low < high:
        mid = (low + high + 1) // 2
        if ok(mid):
            low = mid
        else:
            high = mid - 1
    return low


def lower_target_interval(
    smallest_fp8: torch.Tensor, m: int, n: int, level: float = 0.9
) -> LowerInterval:
    """`level` interval of L* from the smallest FP8 ratios of N⁻ (ascending), m and n.

    `smallest_fp8` needs at least `K_hi + 1` values for a finite upper end; with fewer (or
    K_hi = n: every ratio may lie below ℓ), `hi` is +inf. Empty N⁻ gives NaN bounds.
    """
    if n == 0:
        return LowerInterval(math.nan, math.nan, 0, 0)
    k_lo, k_hi = count_range(m, n, level)
    xs = smallest_fp8.double()
    lo = float(xs[k_lo - 1]) if k_lo >= 1 else 0.0
    hi = float(xs[k_hi]) if k_hi + 1 <= xs.numel() else math.inf  # x_(K_hi+1)
    return LowerInterval(lo, hi, k_lo, k_hi)
