"""Calibrated Clipping: pure functions from (FP8 ratios, BF16 ratios, advantages, weights) to bounds.

All functions take flat 1-D tensors of equal length holding only the valid tokens (see
`prepare_samples`). Notation (reference page `calibrated-clipping.md` §2):

- `r̃` FP8 ratio (what the loss clips), `r` BF16 shadow ratio, `A` advantage, `w` per-token weight
  (aggregation weight x importance weight);
- `N⁻ = {A < 0}`, `N⁺ = {A > 0}` (tokens with A = 0 take no part);
- nominal bounds `L0 = 1 - ratio_clip_min`, `H0 = 1 + ratio_clip_max`, optional dual clip `c`.

Lower bound (quantile matching): `α = #{N⁻: r < L0} / |N⁻|`; `L*` is the FP8 order statistic at
which the strict clip test `r̃ < L*` zeroes exactly as many N⁻ tokens as BF16 did.
Upper bound (rebalancing): `ρ = P / N` with the active-mass form
`P(x; H) = Σ_{N⁺} w·A·x·1[x ≤ H]`, `N(x; L) = Σ_{N⁻} w·|A|·x·1[x ≥ L]·1[x ≤ c]`
(or the surrogate-value form `Σ_{N⁺} w·A·min(x, H)` / `Σ_{N⁻} w·|A|·min(max(x, L), c)`);
`H*` is the smallest H whose balance `ρ(r̃; L, H)` at the lower bound in force is within a
tolerance τ of the best reachable one, `min(ρ(r; L0, H0), ρ(r̃; L, H_max))` (see `upper_target`),
solved exactly after one sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

RhoMode = Literal["active_mass", "surrogate_value"]

#: Relative margin used when a bound must sit just below/above an observed ratio.
EDGE_MARGIN = 1e-6


@dataclass(frozen=True)
class Samples:
    """Valid calibration tokens as flat float64 tensors of equal length (see `prepare_samples`)."""

    fp8_ratio: torch.Tensor
    bf16_ratio: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    num_dropped_nonfinite: int = 0

    @property
    def neg(self) -> torch.Tensor:
        """Boolean mask of negative-advantage tokens (N⁻)."""
        return self.advantages < 0

    @property
    def pos(self) -> torch.Tensor:
        """Boolean mask of positive-advantage tokens (N⁺)."""
        return self.advantages > 0


def prepare_rows(
    fp8_ratio: torch.Tensor,
    bf16_ratio: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, int]:
    """Valid tokens as a float64 [n, 4] table (r̃, r, A, w) and the count of dropped ones.

    Flattens, keeps masked-in tokens whose four values are finite, clamps `|log r| ≤
    log_ratio_clamp` for both ratios. Why: every statistic is over valid tokens only; NaN/inf
    (a broken forward) are dropped and counted rather than poisoning sorts and sums (ambiguity
    A19 clamps large ratios as verl does); float64 keeps sums over millions of tokens exact
    enough for identical results on every rank.
    """
    shape = fp8_ratio.shape
    tensors = {"bf16_ratio": bf16_ratio, "advantages": advantages, "weights": weights, "mask": mask}
    for name, t in tensors.items():
        if t is not None and t.shape != shape:
            raise ValueError(
                f"calibration samples: `{name}` has shape {tuple(t.shape)} but `fp8_ratio` has "
                f"{tuple(shape)}; pass tensors over the same tokens (same [B, S] slice)"
            )
    w = torch.ones_like(fp8_ratio) if weights is None else weights
    cols = [fp8_ratio, bf16_ratio, advantages, w]
    table = torch.stack([c.detach().reshape(-1) for c in cols], dim=1)  # one pass over memory
    finite = torch.isfinite(table).all(dim=1)
    valid = torch.ones_like(finite) if mask is None else mask.reshape(-1) > 0
    dropped = int((valid & ~finite).sum())
    rows = table[valid & finite].to(torch.float64)
    rows[:, :2].clamp_(math.exp(-log_ratio_clamp), math.exp(log_ratio_clamp))
    return rows, dropped


def samples_from_rows(rows: torch.Tensor, num_dropped_nonfinite: int = 0) -> Samples:
    """`Samples` viewing the columns of a [n, 4] (r̃, r, A, w) table."""
    return Samples(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], num_dropped_nonfinite)


def prepare_samples(
    fp8_ratio: torch.Tensor,
    bf16_ratio: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    log_ratio_clamp: float = 20.0,
) -> Samples:
    """`Samples` of the valid tokens (see `prepare_rows`); weights default to 1."""
    rows, dropped = prepare_rows(fp8_ratio, bf16_ratio, advantages, weights, mask, log_ratio_clamp)
    return samples_from_rows(rows, dropped)


def inverted_cdf_quantile(values: torch.Tensor, q: float) -> float:
    """Inverted-CDF ("lower") quantile: `min{v : (1/n)·#{x ≤ v} ≥ q}` for q in (0, 1].

    Equals the `ceil(q·n)`-th smallest value (1-indexed); q = 0 gives the minimum.
    """
    if values.numel() == 0:
        raise ValueError("inverted_cdf_quantile: no values (need at least one token)")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"inverted_cdf_quantile: q must be in [0, 1], got {q}")
    ordered = torch.sort(values.reshape(-1)).values
    k = max(1, math.ceil(q * ordered.numel() - 1e-12))
    return float(ordered[k - 1])


def lower_clip_fraction(ratio: torch.Tensor, low: float) -> float:
    """Share of tokens with `ratio < low` (strict, as a gradient is kept at `ratio == low`)."""
    if ratio.numel() == 0:
        return 0.0
    return float((ratio < low).double().mean())


def lower_target(
    fp8_neg: torch.Tensor, bf16_neg: torch.Tensor, nominal_low: float
) -> tuple[float, float]:
    """Quantile-matched lower bound `L*` and the BF16 lower clip fraction `α` over N⁻.

    `m = #{r < L0}`; with the FP8 ratios sorted ascending (`s_1 ≤ … ≤ s_n`), `L* = s_{m+1}`, the
    smallest value at which `#{r̃ < L*} = m` (ties aside), i.e. the inverted-CDF quantile at
    `α + 1/n`: the plain `α`-quantile `s_m` would, under the strict clip test, clip one token
    fewer than BF16. Edge cases: `m = 0` → `L* = s_1·(1 − 1e-6)` (nothing clipped);
    `m = n` → `L* = s_n·(1 + 1e-6)` (everything clipped, as in BF16).
    Returns `(L*, α)`.
    """
    n = bf16_neg.numel()
    if n == 0 or fp8_neg.numel() != n:
        raise ValueError(
            f"lower_target: need the same non-empty set of negative-advantage tokens in both "
            f"precisions, got {fp8_neg.numel()} FP8 and {n} BF16 ratios"
        )
    m = int((bf16_neg < nominal_low).sum())
    ordered = torch.sort(fp8_neg).values
    if m == 0:
        target = float(ordered[0]) * (1.0 - EDGE_MARGIN)
    elif m == n:
        target = float(ordered[-1]) * (1.0 + EDGE_MARGIN)
    else:
        target = float(ordered[m])
    return target, m / n


def _neg_mass(
    s: Samples, ratio: torch.Tensor, low: float, dual_c: float | None, mode: RhoMode
) -> float:
    """N(x; L): negative-advantage update mass (see module docstring for both forms)."""
    neg = s.neg
    x, coef = ratio[neg], (s.weights * s.advantages.abs())[neg]
    upper = math.inf if dual_c is None else dual_c
    if mode == "active_mass":
        return float((coef * x * ((x >= low) & (x <= upper))).sum())
    return float((coef * x.clamp(min=low).clamp(max=upper)).sum())


def _pos_mass(s: Samples, ratio: torch.Tensor, high: float, mode: RhoMode) -> float:
    """P(x; H): positive-advantage update mass (see module docstring for both forms)."""
    pos = s.pos
    x, coef = ratio[pos], (s.weights * s.advantages)[pos]
    if mode == "active_mass":
        return float((coef * x * (x <= high)).sum())
    return float((coef * x.clamp(max=high)).sum())


def update_balance(
    s: Samples,
    ratio: torch.Tensor,
    low: float,
    high: float,
    dual_c: float | None = None,
    mode: RhoMode = "active_mass",
) -> tuple[float, float, float]:
    """`(ρ, P, N)` for ratios `ratio` (aligned with `s`) under bounds (low, high[, c]).

    `ρ = P / N`; `ρ = inf` when N = 0 < P, NaN when both are 0.
    """
    p = _pos_mass(s, ratio, high, mode)
    n = _neg_mass(s, ratio, low, dual_c, mode)
    if n > 0:
        return p / n, p, n
    return (math.inf if p > 0 else math.nan), p, n


def _solve_active_mass(x: torch.Tensor, coef: torch.Tensor, target: float) -> float | None:
    """Smallest sorted ratio where `Σ coef·x·1[x ≤ H] ≥ target`; None if unreachable."""
    order = torch.argsort(x)
    xs, mass = x[order], torch.cumsum((coef * x)[order], 0)
    hit = torch.nonzero(mass >= target * (1.0 - 1e-12))
    return None if hit.numel() == 0 else float(xs[hit[0, 0]])


def _solve_surrogate(x: torch.Tensor, coef: torch.Tensor, target: float) -> float | None:
    """Smallest H with `Σ coef·min(x, H) ≥ target` (piecewise linear in H); None if unreachable."""
    order = torch.argsort(x)
    xs, cs = x[order], coef[order]
    total = float(cs.sum())
    if total <= 0:
        return None
    below_x = torch.cat([xs.new_zeros(1), torch.cumsum(cs * xs, 0)])  # Σ_{j<i} c·x
    below_c = torch.cat([xs.new_zeros(1), torch.cumsum(cs, 0)])  # Σ_{j<i} c
    value_at = below_x[1:] + xs * (total - below_c[1:])  # P(H = xs_i)
    hit = torch.nonzero(value_at >= target * (1.0 - 1e-12))
    if hit.numel() == 0:
        return None
    i = int(hit[0, 0])
    slope = total - float(below_c[i])  # on (xs_{i-1}, xs_i] every x_j with j ≥ i is capped at H
    return (target - float(below_x[i])) / slope


class UpperTarget(NamedTuple):
    """Result of `upper_target`: the bound and the balances it was derived from."""

    high: float  # H*
    rho_ref: float  # ρ(r; L0, H0), the BF16 balance at the nominal bounds
    rho_best: float  # min(ρ_ref, ρ(r̃; L, H_max)), the best balance reachable in [H_floor, H_max]


def upper_target(
    s: Samples,
    low: float,
    nominal_low: float,
    nominal_high: float,
    high_floor: float,
    high_max: float,
    dual_c: float | None = None,
    mode: RhoMode = "active_mass",
    rho_tolerance: float = 0.0,
) -> UpperTarget:
    """Smallest H in [H_floor, H_max] whose balance is within `rho_tolerance` of the best reachable.

    With `ρ(H) = ρ(r̃; L, H)` at the lower bound `L` that will be in force (non-decreasing in H):

        ρ_best = min(ρ_ref, ρ(H_max)),   ρ_ref = ρ(r; L0, H0)
        H*     = min{ H ∈ [H_floor, H_max] : ρ(H) ≥ (1 − τ)·ρ_best }

    Why: when ρ_ref cannot be reached, every H above the largest positive-advantage ratio gives
    the same ρ, so the cap `H_max` would widen the upper trust region for no gain; the smallest H
    at the best reachable balance is the narrowest bound that buys it. τ is a dead-band: a
    shortfall below τ·ρ_best is not worth a wider bound, so H* stays at the smallest H already
    inside the band (H_floor when the nominal bound is within it). `H* = H_floor` when nothing
    can be gained: no positive mass (ρ_best = 0) or no FP8 negative mass (ρ = ∞ at any H).
    Exact: P is non-decreasing in H, so one sort of the N⁺ FP8 ratios and a cumulative sum find
    the first H whose mass reaches `(1 − τ)·ρ_best·N(r̃; L)`. Raises if ρ_ref is not finite (no
    BF16 negative mass): the caller keeps the previous H.
    """
    if not 0.0 <= rho_tolerance < 1.0:
        raise ValueError(f"upper_target: rho_tolerance must be in [0, 1), got {rho_tolerance}")
    rho_ref, _, _ = update_balance(s, s.bf16_ratio, nominal_low, nominal_high, dual_c, mode)
    if not math.isfinite(rho_ref):
        raise ValueError(f"upper_target: reference balance rho_ref = {rho_ref} is not finite")
    neg_mass = _neg_mass(s, s.fp8_ratio, low, dual_c, mode)
    best_mass = min(rho_ref * neg_mass, _pos_mass(s, s.fp8_ratio, high_max, mode))
    rho_best = best_mass / neg_mass if neg_mass > 0 else math.inf
    target = (1.0 - rho_tolerance) * best_mass
    floor_mass = _pos_mass(s, s.fp8_ratio, high_floor, mode)
    if target <= 0 or floor_mass >= target * (1.0 - 1e-12):
        return UpperTarget(high_floor, rho_ref, rho_best)
    pos = s.pos
    x, coef = s.fp8_ratio[pos], (s.weights * s.advantages)[pos]
    solve = _solve_active_mass if mode == "active_mass" else _solve_surrogate
    h = solve(x, coef, target)
    if h is None:  # unreachable only through rounding: target ≤ P(H_max) by construction
        h = high_max
    return UpperTarget(min(max(h, high_floor), high_max), rho_ref, rho_best)


def smooth_and_cap(
    previous: float, target: float, beta: float, max_step: float, floor: float, ceil: float
) -> float:
    """`clamp(prev + clamp(β·(target − prev), −δ, +δ), floor, ceil)` (spec §2.5)."""
    step = min(max(beta * (target - previous), -max_step), max_step)
    return min(max(previous + step, floor), ceil)
