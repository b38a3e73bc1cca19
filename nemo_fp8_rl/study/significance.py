"""Paired tests and multiplicity for the studies' comparisons.

`paired_test`: per-seed values d_s (differences, paired by seed), their mean with the Student-t
95 % interval `mean ± t_{n−1} · sd / √n` and the two-sided one-sample t-test against 0,
`p = P(|T_{n−1}| ≥ |mean| / (sd / √n))`. `holm`: Holm's step-down adjustment of m p values,
sorted p_(1) ≤ … ≤ p_(m): `p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))`, controlling the
family-wise error rate at alpha when each p̃ is compared with alpha.
"""

from __future__ import annotations

import math

from nemo_fp8_rl.analysis import stats


def paired_test(values: dict[int, float]) -> tuple[stats.Interval, float]:
    """Mean of the finite per-seed `values` with its Student-t 95 % interval and the two-sided
    t-test p against 0 (module doc); p is NaN below 2 seeds, 0 or 1 when every value is equal."""
    iv = stats.mean_interval(list(values.values()))
    if iv.n < 2:
        return iv, math.nan
    se = (iv.high - iv.estimate) / stats.t_quantile(stats.CONFIDENCE, iv.n - 1)
    if se == 0:
        return iv, 0.0 if iv.estimate != 0 else 1.0
    return iv, 1.0 - stats.t_cdf_two_sided(abs(iv.estimate) / se, iv.n - 1)


def holm(ps: list[float]) -> list[float]:
    """Holm-adjusted p values in the order given (module doc); NaN stays NaN and is not counted."""
    ranked = sorted((p, i) for i, p in enumerate(ps) if math.isfinite(p))
    out = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - rank) * p))
        out[i] = running
    return out
