"""Calibrated Clipping: hand-computed formulas, edge cases and the Calibrator's state machine."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from nemo_fp8_rl.calibration import (
    Calibrator,
    inverted_cdf_quantile,
    lower_target,
    prepare_samples,
    smooth_and_cap,
    update_balance,
    upper_target,
)
from nemo_fp8_rl.config.project import CalibrationConfig

T = torch.tensor


def samples(r8, r16, adv, w=None):
    d = torch.float64
    return prepare_samples(
        T(r8, dtype=d), T(r16, dtype=d), T(adv, dtype=d), None if w is None else T(w, dtype=d)
    )


# ---- pure functions ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("q", "expected"), [(0.0, 1.0), (0.2, 1.0), (0.4, 2.0), (0.41, 3.0), (0.8, 4.0), (1.0, 5.0)]
)
def test_inverted_cdf_quantile(q: float, expected: float) -> None:
    assert inverted_cdf_quantile(T([3.0, 1.0, 2.0, 5.0, 4.0]), q) == expected


def test_lower_target_matches_the_bf16_clip_count() -> None:
    fp8 = T([0.9, 0.5, 0.75, 0.7, 1.1], dtype=torch.float64)
    bf16 = T([0.79, 0.85, 0.95, 1.0, 1.05], dtype=torch.float64)  # one below L0 = 0.8
    low, alpha = lower_target(fp8, bf16, 0.8)
    assert alpha == pytest.approx(0.2)
    assert low == 0.7  # the 2nd smallest FP8 ratio: exactly one token has r̃ < 0.7
    assert int((fp8 < low).sum()) == int((bf16 < 0.8).sum())
    bf16_two = T([0.7, 0.75, 0.95, 1.0, 1.05], dtype=torch.float64)
    assert lower_target(fp8, bf16_two, 0.8) == (0.75, pytest.approx(0.4))


def test_lower_target_edges_alpha_zero_and_all_clipped() -> None:
    fp8 = T([0.6, 0.9, 1.2], dtype=torch.float64)
    low, alpha = lower_target(fp8, T([0.85, 0.9, 1.0], dtype=torch.float64), 0.8)
    assert alpha == 0.0 and low == pytest.approx(0.6 * (1 - 1e-6)) and int((fp8 < low).sum()) == 0
    low, alpha = lower_target(fp8, T([0.1, 0.2, 0.3], dtype=torch.float64), 0.8)
    assert alpha == 1.0 and low == pytest.approx(1.2 * (1 + 1e-6)) and int((fp8 < low).sum()) == 3
    with pytest.raises(ValueError, match="negative-advantage tokens"):
        lower_target(T([], dtype=torch.float64), T([], dtype=torch.float64), 0.8)


def test_rho_active_mass_and_surrogate_value_by_hand() -> None:
    #            pos      pos      neg      neg     neg (above dual c = 3)
    s = samples(
        [1.1, 1.3, 0.7, 0.9, 3.5],
        [1.0] * 5,
        [1.0, 2.0, -1.0, -1.0, -2.0],
        [1.0, 1.0, 1.0, 1.0, 0.5],
    )
    rho, p, n = update_balance(s, s.fp8_ratio, 0.8, 1.2, dual_c=3.0, mode="active_mass")
    assert (p, n) == (pytest.approx(1.1), pytest.approx(0.9)) and rho == pytest.approx(1.1 / 0.9)
    rho, p, n = update_balance(s, s.fp8_ratio, 0.8, 1.2, dual_c=3.0, mode="surrogate_value")
    # P = 1·1.1 + 2·min(1.3, 1.2);  N = 1·max(0.7, 0.8) + 1·0.9 + 0.5·2·min(3.5, 3)
    assert (
        p == pytest.approx(3.5)
        and n == pytest.approx(0.8 + 0.9 + 3.0)
        and rho == pytest.approx(3.5 / 4.7)
    )
    rho_no_dual, _, n = update_balance(s, s.fp8_ratio, 0.8, 1.2, dual_c=None, mode="active_mass")
    assert n == pytest.approx(0.9 + 3.5) and rho_no_dual == pytest.approx(1.1 / 4.4)


def test_lowering_L_lowers_rho_in_active_mass_form_and_raises_it_in_surrogate_form() -> None:
    s = samples([1.0, 1.1, 0.7, 0.9], [1.0] * 4, [1.0, 1.0, -1.0, -1.0])
    am = [update_balance(s, s.fp8_ratio, low, 1.2, mode="active_mass")[0] for low in (0.8, 0.6)]
    sv = [update_balance(s, s.fp8_ratio, low, 1.2, mode="surrogate_value")[0] for low in (0.8, 0.6)]
    assert am[1] < am[0] and sv[1] > sv[0]


def test_upper_target_active_mass_by_hand() -> None:
    # tokens: (+1, r=1.0, r̃=1.0), (+1, r=1.1, r̃=1.3), (−1, r=1.0, r̃=1.0); ρ_ref = 2.1 / 1.0
    s = samples([1.0, 1.3, 1.0], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    high, rho_ref, rho_best = upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0)
    assert rho_ref == pytest.approx(2.1) and rho_best == pytest.approx(2.1)
    assert high == pytest.approx(1.3)  # P(1.0) = 1.0 < 2.1 ≤ P(1.3)
    # H_max = 1.25 cuts the 1.3 token off: the best reachable ρ is P(1.0) = 1.0, already reached
    # at the floor, so H* is the floor (the old rule returned the cap 1.25 for nothing)
    capped = upper_target(s, 0.8, 0.8, 1.2, 1.2, 1.25)
    assert capped.high == 1.2 and capped.rho_best == pytest.approx(1.0)
    # r̃ = 0.45 for the negative token, L* = 0.4: target 2.1·0.45 = 0.945 ≤ P(1.0), below the floor
    s_easy = samples([1.0, 1.3, 0.45], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    assert upper_target(s_easy, 0.4, 0.8, 1.2, 1.2, 2.0).high == 1.2


def test_upper_target_does_not_saturate_when_the_reference_balance_is_out_of_reach() -> None:
    # r̃ = [1.0, 1.0, 0.9, 0.95], r = [1.0, 1.0, 0.9, 0.9], A = [+, +, −, −], L* = 0.6:
    # ρ_ref = 2 / 1.8 = 1.111 but ρ(r̃; 0.6, H) = 2 / 1.85 = 1.081 for every H ≥ 1.0
    s = samples([1.0, 1.0, 0.9, 0.95], [1.0, 1.0, 0.9, 0.9], [1.0, 1.0, -1.0, -1.0])
    rho = [update_balance(s, s.fp8_ratio, 0.6, h)[0] for h in (1.2, 2.0)]
    assert rho[0] == rho[1] == pytest.approx(2 / 1.85)
    target = upper_target(s, 0.6, 0.8, 1.2, 1.2, 2.0)
    assert target.high == 1.2  # the floor H0: the smallest admissible H at the best balance
    assert target.rho_ref == pytest.approx(2 / 1.8) and target.rho_best == pytest.approx(rho[0])
    # with H allowed below nominal, the smallest H at the best balance is just above 1.0
    below = upper_target(s, 0.6, 0.8, 1.2, 1.0 + 1e-6, 2.0)
    assert below.high == pytest.approx(1.0 + 1e-6)


def test_rho_dead_band_keeps_a_small_shortfall_from_widening_H() -> None:
    # P(1.2) = 1.0, the token at 1.8 adds 0.003·1.8: ρ(1.2) is 0.5 % short of ρ(2.0) = ρ_best
    s = samples([1.0, 1.8, 1.0], [1.0, 1.0, 1.0], [1.0, 0.003, -1.0])
    assert upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0, rho_tolerance=0.0).high == pytest.approx(1.8)
    assert upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0, rho_tolerance=0.01).high == 1.2
    # a larger shortfall still moves H, to the smallest H inside the band
    s_far = samples([1.0, 1.5, 1.8, 1.0], [1.0] * 4, [1.0, 0.2, 0.003, -1.0])
    assert upper_target(s_far, 0.8, 0.8, 1.2, 1.2, 2.0, rho_tolerance=0.01).high == 1.5
    with pytest.raises(ValueError, match="rho_tolerance"):
        upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0, rho_tolerance=1.0)


def test_upper_target_surrogate_value_solves_the_linear_piece() -> None:
    s = samples([1.0, 1.3, 1.0], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    # ρ_ref = (1.0 + 1.1) / 1.0;  P(H) = min(1, H) + min(1.3, H) = 1 + H on [1, 1.3]  →  H = 1.1
    high, rho_ref, _ = upper_target(s, 0.8, 0.8, 1.2, 1.0 + 1e-6, 2.0, mode="surrogate_value")
    assert rho_ref == pytest.approx(2.1) and high == pytest.approx(1.1)
    # r̃ = 1.8/2.1 for the negative token: target 1.8 = P(H) = 2H below every ratio → H = 0.9
    s_low = samples([1.0, 1.3, 1.8 / 2.1], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    assert upper_target(
        s_low, 0.8, 0.8, 1.2, 0.5, 2.0, mode="surrogate_value"
    ).high == pytest.approx(0.9)


def test_upper_target_rejects_undefined_reference_balance() -> None:
    s = samples([1.0, 0.5], [1.0, 0.5], [1.0, -1.0])  # the only negative token is clipped in BF16
    with pytest.raises(ValueError, match="rho_ref"):
        upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0)


@pytest.mark.parametrize(
    ("prev", "target", "beta", "delta", "floor", "ceil", "expected"),
    [
        (0.8, 0.6, 0.5, 0.05, 0.5, 0.8, 0.75),  # β·Δ = −0.1 capped at −0.05
        (0.8, 0.76, 0.5, 0.05, 0.5, 0.8, 0.78),  # β·Δ = −0.02
        (0.52, 0.3, 1.0, 0.05, 0.5, 0.8, 0.5),  # floor
        (0.8, 0.9, 0.5, 0.05, 0.5, 0.8, 0.8),  # relax-only ceiling
        (1.2, 1.5, 0.5, 0.10, 1.2, 2.0, 1.3),  # β·Δ = 0.15 capped at 0.10
        (1.2, 1.3, 1.0, 0.10, 1.2, 2.0, 1.3),  # β = 1: pure capping, within the cap
    ],
)
def test_smooth_and_cap(prev, target, beta, delta, floor, ceil, expected) -> None:
    assert smooth_and_cap(prev, target, beta, delta, floor, ceil) == pytest.approx(expected)


def test_prepare_samples_drops_nonfinite_and_masked_and_clamps_log_ratio() -> None:
    r8 = T([[1.0, float("nan"), 1e12], [0.9, 1.1, 1.0]])
    r16 = T([[1.0, 1.0, 1.0], [float("inf"), 1.0, 1.0]])
    adv, mask = torch.ones(2, 3), T([[1, 1, 1], [1, 1, 0]])
    s = prepare_samples(r8, r16, adv, None, mask, log_ratio_clamp=20.0)
    assert s.num_dropped_nonfinite == 2 and s.fp8_ratio.numel() == 3
    assert float(s.fp8_ratio.max()) == pytest.approx(math.exp(20.0))
    with pytest.raises(ValueError, match="`advantages` has shape"):
        prepare_samples(r8, r16, torch.ones(3, 2))


# ---- Calibrator -------------------------------------------------------------------------------
OLD = "until_min_clipped"  # the pool rule whose L* = x_(M+1) the hand-worked numbers use


def make_cal(**kw) -> Calibrator:
    cfg = CalibrationConfig(**{"enabled": True, "min_tokens": 4, **kw})
    return Calibrator(cfg, ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None)


def noisy_batch(seed: int, n: int = 4000, noise: float = 0.04):
    g = torch.Generator().manual_seed(seed)
    r16 = torch.exp(0.1 * torch.randn(n, generator=g))
    r8 = r16 * (1 + noise * torch.randn(n, generator=g))
    adv = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0) * torch.rand(n, generator=g)
    return {"fp8_ratio": r8, "bf16_ratio": r16, "advantages": adv}


def test_schedule() -> None:
    cal = make_cal(interval=5, start_step=10)
    assert [k for k in range(30) if cal.is_calibration_step(k)] == [10, 15, 20, 25]
    assert make_cal().is_calibration_step(0) and make_cal().is_calibration_step(40)
    off = Calibrator(CalibrationConfig(enabled=False), 0.2, 0.2)
    assert not off.is_calibration_step(0)


def test_initial_bounds_nominal_or_preset() -> None:
    assert make_cal().bounds == pytest.approx((0.8, 1.2))
    assert make_cal(init_bounds=(0.6, 1.8)).bounds == (0.6, 1.8)


def test_bounds_are_lagged_and_held_between_calibrations() -> None:
    cal = make_cal(interval=3)
    cal.observe(**noisy_batch(0))
    assert cal.bounds == pytest.approx((0.8, 1.2))  # observe never moves the bounds
    m = cal.update(0)
    moved = cal.bounds
    assert (
        moved[0] < 0.8
        and moved == (m["calib_low"], m["calib_high"])
        and cal.last_calibration_step == 0
    )
    for step in (1, 2):
        assert cal.update(step) == {"calib_low": moved[0], "calib_high": moved[1]}
    cal.observe(**noisy_batch(1))
    with pytest.raises(RuntimeError, match="not a calibration step"):
        cal.update(4)


def test_update_rate_limits_and_relax_only() -> None:
    cal = make_cal(smoothing=1.0, max_step_low=0.01, max_step_high=0.02)
    cal.observe(**noisy_batch(0, noise=0.2))
    m = cal.update(0)
    assert cal.bounds[0] == pytest.approx(0.79) and m["calib_cap_hit_low"] == 1.0
    assert 1.2 <= cal.bounds[1] <= 1.22
    tight = make_cal(smoothing=1.0, pool_rule=OLD)
    tight.observe(**noisy_batch(0, noise=0.0))  # identical ratios: x_(M+1) is just above L0
    tight.update(0)
    assert tight.bounds[0] == pytest.approx(0.8)  # relax-only: never above nominal
    allow = make_cal(smoothing=1.0, allow_tighten=True, pool_rule=OLD)
    allow.observe(**noisy_batch(0, noise=0.0))
    allow.update(0)
    assert allow.bounds[0] > 0.8


def test_too_few_tokens_skips_the_update() -> None:
    cal = make_cal(min_tokens=10_000)
    cal.observe(**noisy_batch(0))
    m = cal.update(0)
    assert m["calib_skipped"] == 1.0 and cal.bounds == pytest.approx((0.8, 1.2))
    assert "calib_alpha" not in m and m["calib_n_neg"] > 1000


def test_nan_ratios_are_counted_not_used() -> None:
    batch = noisy_batch(0)
    batch["fp8_ratio"][:10] = float("nan")
    cal = make_cal()
    cal.observe(**batch)
    m = cal.update(0)
    assert m["calib_dropped_nonfinite"] == 10 and math.isfinite(cal.bounds[0])


def test_no_negative_tokens_skips() -> None:
    batch = noisy_batch(0)
    batch["advantages"] = batch["advantages"].abs()
    cal = make_cal()
    cal.observe(**batch)
    assert cal.update(0)["calib_skipped"] == 1.0 and cal.bounds == pytest.approx((0.8, 1.2))


def test_state_dict_round_trip_and_mismatch() -> None:
    cal = make_cal()
    cal.observe(**noisy_batch(0))
    cal.update(0)
    state = cal.state_dict()
    other = make_cal()
    other.load_state_dict(state)
    assert (
        other.bounds == cal.bounds
        and other.history == cal.history
        and other.last_calibration_step == 0
    )
    wrong = Calibrator(CalibrationConfig(enabled=True), 0.2, 0.28)
    with pytest.raises(ValueError, match="nominal bounds"):
        wrong.load_state_dict(state)
    cal.observe(**noisy_batch(1))
    with pytest.raises(RuntimeError, match="call update"):
        cal.state_dict()


def test_structurally_inactive_regime_warns_and_is_recorded() -> None:
    cal = make_cal()
    with pytest.warns(UserWarning, match="structurally inactive"):
        cal.set_updates_per_step(1)
    assert cal.update(1)["calib_structurally_inactive"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal.set_updates_per_step(4)
    assert cal.update(1)["calib_structurally_inactive"] == 0.0


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="high_max"):
        Calibrator(CalibrationConfig(enabled=True, high_max=1.2), 0.2, 0.28)
    with pytest.raises(ValueError, match="ratio_clip_c"):
        Calibrator(CalibrationConfig(enabled=True), 0.2, 0.2, ratio_clip_c=0.9)


def test_updates_per_rollout_batch() -> None:
    from nemo_fp8_rl.calibration import updates_per_rollout_batch

    assert updates_per_rollout_batch(32, 16, 512) == 1
    assert updates_per_rollout_batch(32, 16, 128) == 4
    with pytest.raises(ValueError, match="multiple of policy.train_global_batch_size"):
        updates_per_rollout_batch(32, 16, 100)


# ---- the upper bound inside the Calibrator ------------------------------------------------------
def test_calibrator_keeps_H_when_the_best_balance_needs_no_wider_bound() -> None:
    batch = {
        "fp8_ratio": T([1.0, 1.0, 0.9, 0.95]),
        "bf16_ratio": T([1.0, 1.0, 0.9, 0.9]),
        "advantages": T([1.0, 1.0, -1.0, -1.0]),
    }
    cal = make_cal(min_tokens=1)
    cal.observe(**batch)
    m = cal.update(0)
    assert m["calib_high_target"] == 1.2 and cal.bounds[1] == 1.2  # unchanged at nominal
    wide = make_cal(min_tokens=1, init_bounds=(0.8, 1.4))  # a wider H buys nothing here
    wide.observe(**batch)
    assert wide.update(0)["calib_high_target"] == 1.2 and wide.bounds[1] == pytest.approx(1.3)


def test_H_target_is_solved_at_the_lower_bound_that_will_be_in_force() -> None:
    # N⁻ (A = −1): r = [0.5, 0.9, 0.9, 1.0], r̃ = [0.5, 0.6, 0.65, 1.0]: m = 1, so L* = 0.6
    # N⁺ (A = +1): r = [1.0, 1.0], r̃ = [1.0, 1.3];  ρ_ref = 2.0 / 2.8
    # at L* = 0.6: N = 2.25, H* = 1.3;  at the applied L = 0.8 + 0.5·(0.6 − 0.8) = 0.7: N = 1.0,
    # and P(1.2) = 1.0 ≥ ρ_ref·1.0, so H* = 1.2
    r8 = [0.5, 0.6, 0.65, 1.0, 1.0, 1.3]
    r16 = [0.5, 0.9, 0.9, 1.0, 1.0, 1.0]
    adv = [-1.0, -1.0, -1.0, -1.0, 1.0, 1.0]
    cal = make_cal(min_tokens=1, min_clipped_tokens=0, max_step_low=1.0, pool_rule=OLD)
    cal.observe(fp8_ratio=T(r8), bf16_ratio=T(r16), advantages=T(adv))
    m = cal.update(0)
    assert m["calib_low_target"] == pytest.approx(0.6) and cal.bounds[0] == pytest.approx(0.7)
    s = samples(r8, r16, adv)
    at_raw = upper_target(s, 0.6, 0.8, 1.2, 1.2, 2.0, rho_tolerance=0.01).high
    at_applied = upper_target(s, cal.bounds[0], 0.8, 1.2, 1.2, 2.0, rho_tolerance=0.01).high
    assert at_raw == pytest.approx(1.3) and at_applied == 1.2
    assert m["calib_high_target"] == at_applied and cal.bounds[1] == 1.2
    assert m["calib_rho_fp8_next"] == pytest.approx(update_balance(s, s.fp8_ratio, 0.7, 1.2)[0])


# ---- the lower bound's uncertainty --------------------------------------------------------------
def test_L_update_is_weighted_by_the_number_of_bf16_clipped_tokens() -> None:
    batch = noisy_batch(0, noise=0.2)  # r = exp(0.1·z): a handful of BF16-clipped N⁻ tokens
    neg = batch["advantages"] < 0
    m_clipped = int((batch["bf16_ratio"][neg] < 0.8).sum())
    assert 0 < m_clipped < 40
    full = make_cal(min_clipped_tokens=0, max_step_low=1.0)
    full.observe(**batch)
    mf = full.update(0)
    damped = make_cal(min_clipped_tokens=4 * m_clipped, max_step_low=1.0)
    damped.observe(**batch)
    md = damped.update(0)
    assert md["calib_bf16_lower_count_neg"] == m_clipped and md["calib_low_weight"] == 0.25
    assert mf["calib_low_weight"] == 1.0 and md["calib_low_target"] == mf["calib_low_target"]
    assert 0.8 - damped.bounds[0] == pytest.approx(0.25 * (0.8 - full.bounds[0]))
    none_clipped = {**batch, "bf16_ratio": batch["bf16_ratio"].clamp(min=0.85)}
    frozen = make_cal()
    frozen.observe(**none_clipped)
    assert frozen.update(0)["calib_low_weight"] == 0.0 and frozen.bounds[0] == 0.8


def test_calibration_logs_the_order_statistic_interval_of_L_target() -> None:
    cal = make_cal(min_clipped_tokens=0)
    cal.observe(**noisy_batch(0, noise=0.2))
    m = cal.update(0)
    lo, hi = m["calib_low_target_ci90_lo"], m["calib_low_target_ci90_hi"]
    assert lo <= m["calib_low_target"] <= hi and m["calib_low_target_ci90_width"] == hi - lo > 0


def test_windows_are_pooled_until_L_target_rests_on_min_clipped_tokens() -> None:
    """Two windows with m clipped tokens each and m_min = 2m: the first moves L with weight ½,
    the second pools both windows (weight 1), and a checkpoint taken between them resumes to
    the same second update."""
    batch = noisy_batch(0, noise=0.2)
    neg = batch["advantages"] < 0
    m_clipped = int((batch["bf16_ratio"][neg] < 0.8).sum())
    cal = make_cal(min_clipped_tokens=2 * m_clipped, max_step_low=1.0, pool_rule=OLD)
    cal.observe(**batch)
    first = cal.update(0)
    assert first["calib_low_weight"] == 0.5 and first["calib_low_pool_windows"] == 1.0
    resumed = make_cal(min_clipped_tokens=2 * m_clipped, max_step_low=1.0, pool_rule=OLD)
    resumed.load_state_dict(json.loads(json.dumps(cal.state_dict())))
    later = noisy_batch(1, noise=0.2)
    outs = []
    for c in (cal, resumed):
        c.observe(**later)
        outs.append(c.update(c.cfg.interval))
    pooled = outs[0]
    assert pooled["calib_low_pool_windows"] == 2.0 and pooled["calib_low_weight"] == 1.0
    assert pooled["calib_low_pool_clipped"] == m_clipped + pooled["calib_bf16_lower_count_neg"]
    assert outs[1] == pooled and resumed.bounds == cal.bounds
