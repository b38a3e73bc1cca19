"""Sampling uncertainty of the quantile-matched lower bound L* (a cheap bootstrap).

`L*` rests on `m = #{N⁻ : r < L0}`, the negative-advantage tokens BF16 clips: it is the
(m+1)-th smallest FP8 ratio over N⁻ (`bounds.lower_target`). With few clipped tokens both m and
the order statistic are noisy, so each calibration logs m and a bootstrap interval of L*.

Ordinary (multinomial) bootstrap over the N⁻ tokens: replicate b draws n tokens with
replacement, token i `c_i` times, and

    m_b  = Σ_i c_i·1[r_i < L0]
    L*_b = smallest r̃ at which the c-weighted count of r̃ values, in ascending order, reaches m_b + 1
           (× (1 − 1e-6) when m_b = 0; × (1 + 1e-6) of the largest drawn r̃ when every drawn token
           is clipped), i.e. `lower_target` on the resample.

Only tokens that can change L*_b need counts: the T smallest r̃ (T ≥ m_b + 1 draws in every
replicate, doubled until it is) and the BF16-clipped ones beyond them (they only add to m_b).
The draws that land on those tokens are Binomial(n, |U|/n) in number and uniform over them, so
after one sort of N⁻ the cost is O(B·(T + m)) with T ≈ 2m + 64, not O(B·n), and it stays cheap
on millions of tokens. The generator is seeded from the step, so every data-parallel rank (which
holds the same pooled tokens) gets the same interval.
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
    out = xs[idx] * edge[(m_b == 0).long()]
    if not bool(reached.all()):  # every drawn token clipped: just above the largest drawn ratio
        rest = ~reached
        drawn = torch.where(counts[rest] > 0, torch.arange(t).expand_as(counts[rest]), -1)
        top = xs[drawn.max(1).values.clamp(min=0)] * (1.0 + EDGE_MARGIN)
        out[rest] = top
    return torch.where(cum[:, -1] > 0, out, torch.nan), reached


def _draw_counts(n: int, size: int, samples: int, g: torch.Generator) -> torch.Tensor:
    """[samples, size] draw counts of `size` given tokens in resamples of n tokens out of n.

    Multinomial with replacement, restricted to the given tokens: how many of a replicate's n
    draws land on them is Binomial(n, size/n), and those draws are uniform over them. Cost
    O(samples·size), independent of n.
    """
    prob = torch.full((samples,), size / n, dtype=torch.float64)
    hits = torch.binomial(torch.full_like(prob, float(n)), prob, generator=g).long()
    which = torch.randint(0, size, (int(hits.sum()),), generator=g)
    replicate = torch.repeat_interleave(torch.arange(samples), hits)
    flat = torch.bincount(replicate * size + which, minlength=samples * size)
    return flat.view(samples, size).double()


def _replicates(xs: torch.Tensor, clipped: torch.Tensor, samples: int, g: torch.Generator):
    """L*_b for `samples` bootstrap replicates; `xs` ascending FP8 ratios of N⁻, `clipped` aligned."""
    n = xs.numel()
    t = min(n, 2 * int(clipped.sum()) + 64)
    while True:
        beyond = torch.nonzero(clipped[t:]).numel()  # clipped tokens past the T smallest
        counts = _draw_counts(n, t + beyond, samples, g)
        extra = counts[:, t:].sum(1)  # they only add to m_b
        out, reached = replicate_targets(xs[:t], clipped[:t], counts[:, :t], extra)
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
    """Bootstrap `level` interval of L* over the negative-advantage tokens (see module).

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
