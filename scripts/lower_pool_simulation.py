"""Simulation of the two L* pool rules (`calibration.lower_pool`): bias of the matched quantile and
coverage of the 90 % order-statistic interval, at m BF16-clipped tokens per window.

Model, per calibration window of n = 250 negative-advantage tokens: the BF16 ratio
log r ~ N(0, s²) with s set so that P(r < L0) = p = m/n (L0 = 0.8), and the FP8 ratio of the same
token r̃ = r·exp(σz), z ~ N(0, 1) independent. σ is set so that FP8 puts `quotient` times as many
tokens below L0 as BF16 at m = 1, `quotient` being the committed study's measured FP8 ÷ BF16
shadow share below 1 − ε (docs/study/results.json; 6.4). The target ℓ is the p-quantile of r̃,
ℓ = exp(√(s² + σ²)·Φ⁻¹(p)). An estimate L* is scored by its level F̃(L*) = Φ(log L* / √(s² + σ²)),
the share of FP8 ratios below it: the bias on the matched quantile is E[F̃(L*)]/p − 1 (> 0: L*
too high, FP8's extra clipping under-corrected), and the coverage is the share of calibrations
whose 90 % interval holds ℓ.

- `until_min_clipped` (the old rule): `LowerPool` itself over `chains` runs of 2W windows,
  scored at every calibration once W windows have passed (standard error over runs);
- `fixed_windows`: its pool is the latest W windows whatever they hold, so each scored
  calibration is one pool of W independent windows: `pools` of them are drawn at once
  (`fixed_pool_estimates`, which `tests/test_lower_pool_rule.py` holds equal to `LowerPool`).
- warm-up scenario (m = 1): the run's first window clips 11 times as often (the committed study's
  first window after the warm-up: m = 11, then 0–2), scored over the 16 calibrations that follow
  it (the study's run length), against the later windows' ℓ; both rules through `LowerPool`.

    uv run python scripts/lower_pool_simulation.py     # the table in docs/calibrated-clipping.md
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.calibration.lower_pool import LowerPool  # noqa: E402
from nemo_fp8_rl.calibration.order_interval import count_range  # noqa: E402

L0, N_WINDOW, W, M_MIN, LEVEL = 0.8, 250, 16, 16, 0.9
WARMUP_FACTOR, WARMUP_CALIBRATIONS = 11, 16
RESULTS = ROOT / "docs" / "study" / "results.json"
QUOTIENT_ROW = "same tokens, FP8 ÷ BF16 shadow ratio below 1−ε"


@dataclass(frozen=True)
class Result:
    """Bias of the matched level, its standard error, and the interval's coverage."""

    bias: float
    se: float
    coverage: float
    samples: int


def ndtri(p: float) -> float:
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


def measured_quotient(path: Path = RESULTS) -> float:
    """The committed study's FP8 ÷ BF16 share of A<0 tokens below 1 − ε (shadow, same tokens)."""
    rows = json.loads(path.read_text())["targets"]
    return next(r["interval"]["mean"] for r in rows if r["what"].startswith(QUOTIENT_ROW))


def fp8_sigma(quotient: float) -> float:
    """σ with P(r̃ < L0) = quotient·P(r < L0) at m = 1 clipped token per window."""
    p = 1 / N_WINDOW
    s, total = math.log(L0) / ndtri(p), math.log(L0) / ndtri(quotient * p)
    return math.sqrt(total * total - s * s)


@dataclass(frozen=True)
class Model:
    """The ratio model at m clipped tokens per window."""

    m: float
    sigma: float

    @property
    def p(self) -> float:
        return self.m / N_WINDOW

    @property
    def s(self) -> float:
        return math.log(L0) / ndtri(self.p)

    @property
    def scale(self) -> float:
        return math.sqrt(self.s**2 + self.sigma**2)

    @property
    def ell(self) -> float:
        return math.exp(self.scale * ndtri(self.p))

    def draw(self, g: torch.Generator, shape: tuple[int, ...], m: float | None = None):
        """(FP8, BF16) ratios; `m` overrides the clipped count (the warm-up window)."""
        s = self.s if m is None else math.log(L0) / ndtri(m / N_WINDOW)
        r = torch.exp(s * torch.randn(shape, generator=g, dtype=torch.float64))
        return r * torch.exp(self.sigma * torch.randn(shape, generator=g, dtype=torch.float64)), r

    def level(self, x: torch.Tensor | float) -> torch.Tensor:
        return torch.special.ndtr(torch.log(torch.as_tensor(x, dtype=torch.float64)) / self.scale)


def fixed_pool_estimates(
    fp8: torch.Tensor, bf16: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row (one pool's tokens): `fixed_windows`' L* and M, vectorised."""
    n = fp8.shape[1]
    m = (bf16 < L0).sum(1)
    xs = torch.sort(fp8, 1).values
    below = xs.gather(1, (m - 1).clamp(min=0)[:, None])[:, 0]
    above = xs.gather(1, m.clamp(max=n - 1)[:, None])[:, 0]
    low = below + m / n * (above - below)
    low = torch.where(m == 0, xs[:, 0] * (1 - 1e-6), low)
    return low, m


def simulate_fixed(
    model: Model, pools: int, seed: int = 0, batch: int = 500, coverage_pools: int | None = None
) -> Result:
    """`fixed_windows` over independent pools of W windows (coverage over the first
    `coverage_pools` of them, all by default: the interval costs a Python loop per pool)."""
    g = torch.Generator().manual_seed(seed)
    levels, covered, scored, n = [], 0, 0, W * N_WINDOW
    limit = pools if coverage_pools is None else coverage_pools
    for _ in range(max(1, pools // batch)):
        fp8, bf16 = model.draw(g, (batch, n))
        low, m = fixed_pool_estimates(fp8, bf16)
        levels.append(model.level(low) / model.p - 1)
        xs = torch.sort(fp8, 1).values
        for row, count in enumerate(m.tolist()[: max(0, limit - scored)]):
            k_lo, k_hi = count_range(count, n, LEVEL)
            lo = float(xs[row, k_lo - 1]) if k_lo >= 1 else 0.0
            covered += lo <= model.ell <= float(xs[row, k_hi])
            scored += 1
    x = torch.cat(levels)
    return Result(float(x.mean()), float(x.std()) / math.sqrt(len(x)), covered / scored, len(x))


def simulate_chain(
    rule: str, model: Model, chains: int, seed: int = 0, warmup: bool = False
) -> Result:
    """`LowerPool` with `rule` over `chains` runs (see the module docstring for what is scored)."""
    g = torch.Generator().manual_seed(seed)
    windows = WARMUP_CALIBRATIONS + 1 if warmup else 2 * W
    per_chain, covered, total = [], 0, 0
    for _ in range(chains):
        pool, levels = LowerPool(L0, M_MIN, W, rule), []
        for k in range(windows):
            first = model.m * WARMUP_FACTOR if warmup and k == 0 else None
            pool.add(k, *model.draw(g, (N_WINDOW,), first))
            if k >= (1 if warmup else W):
                t = pool.target(LEVEL)
                levels.append(float(model.level(t.low_target)) / model.p - 1)
                covered += t.interval.lo <= model.ell <= t.interval.hi
                total += 1
        per_chain.append(sum(levels) / len(levels))
    x = torch.tensor(per_chain, dtype=torch.float64)
    return Result(float(x.mean()), float(x.std()) / math.sqrt(chains), covered / total, total)


def table(ms=(1, 2, 4, 8, 16), chains: int = 600, pools: int = 20_000) -> str:
    """Markdown: both rules' bias and coverage per m, and the warm-up scenario at m = 1."""
    sigma = fp8_sigma(measured_quotient())
    head = (
        f"σ = {sigma:.4f} (FP8 ÷ BF16 share below L0 = {measured_quotient():.2f} at m = 1), "
        f"n = {N_WINDOW} A<0 tokens per window, W = {W}, m_min = {M_MIN}, L0 = {L0}; "
        f"old rule: {chains} runs, fixed rule: {pools} pools (coverage over 2000); bias ± standard "
        "error\n\n"
        "| m per window | bias, until_min_clipped (old) | coverage (old) | bias, fixed_windows (new) "
        "| coverage (new) | abs(new bias) ÷ abs(old bias) |\n|---|---|---|---|---|---|"
    )
    lines = [head]
    for m in ms:
        model = Model(m, sigma)
        old = simulate_chain("until_min_clipped", model, chains)
        new = simulate_fixed(model, pools, coverage_pools=2000)
        lines.append(_line(f"{m}", old, new))
    model = Model(1, sigma)
    old = simulate_chain("until_min_clipped", model, chains, warmup=True)
    new = simulate_chain("fixed_windows", model, chains, warmup=True)
    lines.append(_line("1, first window ×11 (16 calibrations after it)", old, new))
    return "\n".join(lines)


def _line(label: str, old: Result, new: Result) -> str:
    return (
        f"| {label} | {old.bias:+.4f} ± {old.se:.4f} | {old.coverage:.3f} | "
        f"{new.bias:+.4f} ± {new.se:.4f} | {new.coverage:.3f} | "
        f"{abs(new.bias) / abs(old.bias):.3f} |"
    )


if __name__ == "__main__":
    print(table())
