"""Properties of the calibration targets on random inputs (hypothesis)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_fp8_rl.calibration import lower_target, prepare_samples, update_balance, upper_target

ratios = st.lists(st.floats(0.3, 3.0, allow_nan=False), min_size=4, max_size=60, unique=True)


@settings(max_examples=200, deadline=None)
@given(fp8=ratios, data=st.data())
def test_lower_target_reproduces_the_bf16_clip_count(fp8: list[float], data) -> None:
    bf16 = data.draw(
        st.lists(st.floats(0.3, 3.0, allow_nan=False), min_size=len(fp8), max_size=len(fp8))
    )
    r8, r16 = torch.tensor(fp8, dtype=torch.float64), torch.tensor(bf16, dtype=torch.float64)
    low, alpha = lower_target(r8, r16, 0.8)
    assert int((r8 < low).sum()) == int((r16 < 0.8).sum()) == round(alpha * len(fp8))


@settings(max_examples=200, deadline=None)
@given(fp8=ratios, data=st.data())
def test_upper_target_is_the_smallest_balancing_bound(fp8: list[float], data) -> None:
    n = len(fp8)
    bf16 = data.draw(st.lists(st.floats(0.5, 2.0, allow_nan=False), min_size=n, max_size=n))
    adv = data.draw(st.lists(st.sampled_from([-1.0, -0.5, 0.5, 1.0]), min_size=n, max_size=n))
    d = torch.float64
    s = prepare_samples(
        torch.tensor(fp8, dtype=d), torch.tensor(bf16, dtype=d), torch.tensor(adv, dtype=d)
    )
    try:
        high, rho_ref = upper_target(s, 0.7, 0.8, 1.2, 1.2, 2.0)
    except ValueError:  # no BF16 negative mass: ρ_ref undefined, the caller keeps H
        assert not math.isfinite(update_balance(s, s.bf16_ratio, 0.8, 1.2)[0])
        return
    rho_at = update_balance(s, s.fp8_ratio, 0.7, high)[0]
    if high < 2.0:
        assert rho_at >= rho_ref * (1 - 1e-9) or math.isnan(rho_at)
    if 1.2 < high < 2.0:  # interior: any smaller admissible H falls short
        below = max(1.2, math.nextafter(high, 0.0))
        assert update_balance(s, s.fp8_ratio, 0.7, below)[0] < rho_ref
