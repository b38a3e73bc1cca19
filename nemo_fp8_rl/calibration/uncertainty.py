"""Sampling uncertainty of the quantile-matched lower bound L* (a cheap Poisson bootstrap).

`L*` rests on `m = #{N⁻ : r < L0}`, the negative-advantage tokens BF16 clips: it is the
(m+1)-th smallest FP8 ratio over N⁻ (`bounds.lower_target`). With few clipped tokens both m and
the order statistic are noisy, so each calibration logs m and a bootstrap interval of L*.

Poisson bootstrap (each token drawn `c_i ~ Poisson(1)` times, independently, instead of a
multinomial resample of size n; the standard large-sample equivalent): for replicate b,

    m_b  = Σ_i c_i·1[r_i < L0]
    L*_b = smallest r̃ at which the c-weighted count of r̃ values, in ascending order, reaches m_b + 1
           (× (1 − 1e-6) when m_b = 0; × (1 + 1e-6) of the largest drawn r̃ when every drawn token
           is clipped), i.e. `lower_target` on the resample.

Only tokens that can change L*_b need counts: the T smallest r̃ (T ≥ m_b + 1 in every replicate,
doubled until it is) and the BF16-clipped ones beyond them (they only add to m_b). The cost is
one sort of N⁻ and O(B·(T + m)) draws with T ≈ 2m + 64, independent of |N⁻| beyond the sort, so
it stays cheap on millions of tokens. The generator is seeded from the step, so every
data-parallel rank (which holds the same pooled tokens) gets the same interval.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from nemo_fp8_rl.calibration.bounds import EDGE_MARGIN


class LowerInterval(NamedTuple):
    """Bootstrap interval of L*: `(lo, hi)` quantiles at (1 ∓ level)/2, and the replicates used."""

    lo: float
    hi: float
    replicates: int


def replicate_targets(
    xs: torch.Tensor, clipped: torch.Tensor, counts: torch.Tensor, extra_clipped: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """L*_b of each replicate from its draw counts, and whether the T smallest r̃ sufficed.

    `xs`: the T smallest FP8 ratios of N⁻, ascending; `clipped`: 1.0 where BF16 clips that token
    (r < L0); `counts` [B, T]: how often replicate b drew each of them; `extra_clipped` [B]: how
    often it drew the BF16-clipped tokens beyond the T smallest. Where `reached` is False the
    (m_b+1)-th drawn ratio lies beyond T; the value then is the all-clipped case (correct only
    when T covers every token). NaN for a replicate that drew none of the T tokens.
    """
    t = xs.numel()
    m_b = (counts * clipped).sum(1) + extra_clipped
    cum = torch.cumsum(counts, 1)
    reached = cum[:, -1] >= m_b + 1
    idx = torch.searchsorted(cum, (m_b + 1).unsqueeze(1)).squeeze(1).clamp(max=t - 1)
    edge = torch.tensor([1.0, 1.0 - EDGE_MARGIN], dtype=xs.dtype)  # × (1 − 1e-6) when m_b = 0
    inner = xs[idx] * edge[(m_b == 0).long()]
    present = counts > 0
    last = torch.where(present, torch.arange(t).expand_as(counts), -1).max(1).values
    top = xs[last.clamp(min=0)] * (1.0 + EDGE_MARGIN)  # every drawn token clipped
    out = torch.where(reached, inner, top)
    return torch.where(present.any(1), out, torch.nan), reached


def _replicates(xs: torch.Tensor, clipped: torch.Tensor, samples: int, g: torch.Generator):
    """L*_b for `samples` Poisson replicates; `xs` ascending FP8 ratios of N⁻, `clipped` aligned."""
    n = xs.numel()
    t = min(n, 2 * int(clipped.sum()) + 64)
    while True:
        extra = int(clipped[t:].sum())  # clipped tokens beyond the T smallest: they only add to m_b
        counts = torch.poisson(torch.ones(samples, t, dtype=torch.float64), generator=g)
        c_extra = torch.poisson(torch.ones(samples, extra, dtype=torch.float64), generator=g)
        out, reached = replicate_targets(xs[:t], clipped[:t], counts, c_extra.sum(1))
        if bool(reached.all()) or t == n:
            return out[torch.isfinite(out)]
        t = min(n, 2 * t)


def lower_target_interval(
    fp8_neg: torch.Tensor,
    bf16_neg: torch.Tensor,
    nominal_low: float,
    samples: int = 200,
    level: float = 0.9,
    seed: int = 0,
) -> LowerInterval:
    """Poisson-bootstrap `level` interval of L* over the negative-advantage tokens (see module).

    Returns NaN bounds when there are no tokens or `samples` is 0.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"lower_target_interval: level must be in (0, 1), got {level}")
    if fp8_neg.numel() != bf16_neg.numel():
        raise ValueError(
            f"lower_target_interval: {fp8_neg.numel()} FP8 and {bf16_neg.numel()} BF16 ratios; "
            "pass the same negative-advantage tokens in both precisions"
        )
    if fp8_neg.numel() == 0 or samples < 1:
        return LowerInterval(math.nan, math.nan, 0)
    order = torch.argsort(fp8_neg)
    xs = fp8_neg[order].double()
    clipped = (bf16_neg[order] < nominal_low).double()
    g = torch.Generator().manual_seed(seed)
    reps = _replicates(xs, clipped, samples, g)
    if reps.numel() == 0:
        return LowerInterval(math.nan, math.nan, 0)
    q = torch.tensor([(1.0 - level) / 2, (1.0 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(reps, q).tolist()
    return LowerInterval(lo, hi, int(reps.numel()))
