"""Calibrated Clipping: hand-computed formulas, edge cases and the Calibrator's state machine."""

from __future__ import annotations

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
    high, rho_ref = upper_target(s, 0.8, 0.8, 1.2, 1.2, 2.0)
    assert rho_ref == pytest.approx(2.1) and high == pytest.approx(
        1.3
    )  # P(1.0) = 1.0 < 2.1 ≤ P(1.3)
    assert upper_target(s, 0.8, 0.8, 1.2, 1.2, 1.25)[0] == 1.25  # unreachable below high_max
    # r̃ = 0.45 for the negative token, L* = 0.4: target 2.1·0.45 = 0.945 ≤ P(1.0), below the floor
    s_easy = samples([1.0, 1.3, 0.45], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    assert upper_target(s_easy, 0.4, 0.8, 1.2, 1.2, 2.0)[0] == 1.2


def test_upper_target_surrogate_value_solves_the_linear_piece() -> None:
    s = samples([1.0, 1.3, 1.0], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    # ρ_ref = (1.0 + 1.1) / 1.0;  P(H) = min(1, H) + min(1.3, H) = 1 + H on [1, 1.3]  →  H = 1.1
    high, rho_ref = upper_target(s, 0.8, 0.8, 1.2, 1.0 + 1e-6, 2.0, mode="surrogate_value")
    assert rho_ref == pytest.approx(2.1) and high == pytest.approx(1.1)
    # r̃ = 1.8/2.1 for the negative token: target 1.8 = P(H) = 2H below every ratio → H = 0.9
    s_low = samples([1.0, 1.3, 1.8 / 2.1], [1.0, 1.1, 1.0], [1.0, 1.0, -1.0])
    assert upper_target(s_low, 0.8, 0.8, 1.2, 0.5, 2.0, mode="surrogate_value")[0] == pytest.approx(
        0.9
    )


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
    tight = make_cal(smoothing=1.0)
    tight.observe(**noisy_batch(0, noise=0.0))  # identical ratios: L* is just above L0
    tight.update(0)
    assert tight.bounds[0] == pytest.approx(0.8)  # relax-only: never above nominal
    allow = make_cal(smoothing=1.0, allow_tighten=True)
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
