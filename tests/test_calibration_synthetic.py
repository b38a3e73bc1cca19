"""The mechanism Calibrated Clipping corrects, on synthetic ratios with a known distribution.

BF16 ratios r = exp(N(0, 0.07²)); FP8 ratios r̃ = r·(1 + ε), ε ~ N(0, 0.0376²), so the ratio NMAE
is E|ε| ≈ 3 %. Uncalibrated FP8 clips several times more negative-advantage tokens at L0 = 0.8
than BF16; after repeated calibrations (default β, δ) on fresh batches the FP8 lower clip fraction
matches BF16's within sampling error and ρ(r̃; L, H) matches ρ_ref to within 1 % (the dead-band
τ = 0.5 % plus sampling error), closer than the nominal bounds do.
"""

from __future__ import annotations

import math

import torch

from nemo_fp8_rl.calibration import Calibrator, prepare_samples, update_balance
from nemo_fp8_rl.calibration.diagnostics import clip_fractions, ratio_nmae
from nemo_fp8_rl.config.project import CalibrationConfig

torch.set_num_threads(1)
N_TOKENS = 400_000


def batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r16 = torch.exp(0.07 * torch.randn(N_TOKENS, generator=g, dtype=torch.float64))
    r8 = r16 * (1 + 0.0376 * torch.randn(N_TOKENS, generator=g, dtype=torch.float64))
    sign = torch.where(torch.rand(N_TOKENS, generator=g) < 0.5, -1.0, 1.0).double()
    adv = sign * (0.2 + torch.rand(N_TOKENS, generator=g, dtype=torch.float64))
    weights = 0.5 + torch.rand(N_TOKENS, generator=g, dtype=torch.float64)
    return {"fp8_ratio": r8, "bf16_ratio": r16, "advantages": adv, "weights": weights}


def lower_frac(ratio: torch.Tensor, adv: torch.Tensor, low: float) -> float:
    return clip_fractions(ratio, adv, torch.ones_like(adv), low, math.inf)["clip_lower_frac_neg"]


def test_fp8_noise_overclips_and_calibration_restores_bf16_clipping() -> None:
    b = batch(0)
    ones = torch.ones_like(b["advantages"])
    assert abs(ratio_nmae(b["fp8_ratio"], b["bf16_ratio"], ones) - 0.03) < 0.003
    bf16_frac = lower_frac(b["bf16_ratio"], b["advantages"], 0.8)
    fp8_frac = lower_frac(b["fp8_ratio"], b["advantages"], 0.8)
    assert bf16_frac * (N_TOKENS / 2) > 100  # enough clipped tokens for a meaningful comparison
    assert fp8_frac > 2.5 * bf16_frac  # the over-clipping the method exists for

    cal = Calibrator(CalibrationConfig(enabled=True, interval=1), 0.2, 0.2)
    for step in range(12):  # stationary distribution: the EMA converges geometrically (β = 0.5)
        cal.observe(**batch(100 + step))
        metrics = cal.update(step)
    low, high = cal.bounds
    assert low < 0.8 and high > 1.2  # relaxed L, rebalanced H

    fresh = batch(999)
    n_neg = float((fresh["advantages"] < 0).sum())
    bf16_fresh = lower_frac(fresh["bf16_ratio"], fresh["advantages"], 0.8)
    fp8_calibrated = lower_frac(fresh["fp8_ratio"], fresh["advantages"], low)
    sigma = math.sqrt(2 * bf16_fresh * (1 - bf16_fresh) / n_neg)  # two independent estimates
    assert abs(fp8_calibrated - bf16_fresh) < 4 * sigma
    s = prepare_samples(**fresh)
    rho_ref = update_balance(s, s.bf16_ratio, 0.8, 1.2)[0]
    rho_fp8 = update_balance(s, s.fp8_ratio, low, high)[0]
    rho_fp8_nominal = update_balance(s, s.fp8_ratio, 0.8, 1.2)[0]
    assert abs(rho_fp8 / rho_ref - 1) < 0.01
    assert abs(rho_fp8 / rho_ref - 1) < abs(rho_fp8_nominal / rho_ref - 1)
    assert metrics["calib_alpha"] == metrics["calib_bf16_lower_frac_neg"]
    assert metrics["clip_ratio_fp8_vs_bf16"] > 1.5
