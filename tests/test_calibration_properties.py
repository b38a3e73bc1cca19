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


def _rho(s, low: float, high: float, mode: str) -> float:
    return update_balance(s, s.fp8_ratio, low, high, mode=mode)[0]


@settings(max_examples=300, deadline=None)
@given(
    fp8=ratios,
    data=st.data(),
    low=st.floats(0.5, 0.8),
    floor=st.sampled_from([1.0 + 1e-6, 1.2]),
    high_max=st.sampled_from([1.5, 2.0]),
    tol=st.sampled_from([0.0, 0.005, 0.01, 0.05]),
    mode=st.sampled_from(["active_mass", "surrogate_value"]),
)
def test_upper_target_is_the_smallest_bound_at_the_best_reachable_balance(
    fp8: list[float], data, low: float, floor: float, high_max: float, tol: float, mode: str
) -> None:
    n = len(fp8)
    bf16 = data.draw(st.lists(st.floats(0.5, 2.0, allow_nan=False), min_size=n, max_size=n))
    adv = data.draw(st.lists(st.sampled_from([-1.0, -0.5, 0.5, 1.0]), min_size=n, max_size=n))
    d = torch.float64
    s = prepare_samples(
        torch.tensor(fp8, dtype=d), torch.tensor(bf16, dtype=d), torch.tensor(adv, dtype=d)
    )
    try:
        high, rho_ref, _ = upper_target(s, low, 0.8, 1.2, floor, high_max, None, mode, tol)
    except ValueError:  # no BF16 negative mass: ρ_ref undefined, the caller keeps H
        assert not math.isfinite(update_balance(s, s.bf16_ratio, 0.8, 1.2, mode=mode)[0])
        return
    assert floor <= high <= high_max
    rho_max = _rho(s, low, high_max, mode)
    if math.isnan(rho_max) or math.isinf(rho_max) or rho_max == 0:
        assert high == floor  # nothing to balance (no FP8 negative or no positive mass)
        return
    # best reachable balance, by brute force: ρ is non-decreasing in H
    candidates = sorted({floor, high_max, *(x for x in fp8 if floor < x < high_max)})
    best = min(rho_ref, max(_rho(s, low, h, mode) for h in candidates))
    goal = (1 - tol) * best
    assert _rho(s, low, high, mode) >= goal * (1 - 1e-9)
    if mode == "active_mass":  # a step function: H* is the floor or a positive ratio
        pos_ratios = {x for x, a in zip(fp8, adv, strict=True) if a > 0}
        assert high == floor or high in pos_ratios
        smaller = [h for h in candidates if h < high]
    else:  # continuous: just below H* must fall short
        smaller = [max(floor, high * (1 - 1e-6))] if high > floor else []
    for h in smaller:
        assert _rho(s, low, h, mode) < goal, f"a smaller H = {h} already reaches the goal"
