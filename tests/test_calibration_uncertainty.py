"""The bootstrap interval of L*: exact per replicate, calibrated against the true sampling spread."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_fp8_rl.calibration import lower_target, lower_target_interval
from nemo_fp8_rl.calibration.uncertainty import replicate_targets

d = torch.float64


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    t_share=st.floats(0.1, 1.0),
    seed=st.integers(0, 10_000),
    clip_share=st.floats(0.0, 1.0),
)
def test_each_replicate_is_lower_target_on_its_resample(
    n: int, t_share: float, seed: int, clip_share: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    xs = torch.sort(torch.rand(n, generator=g, dtype=d) + 0.3).values  # ascending FP8 ratios
    clipped = (torch.rand(n, generator=g) < clip_share).double()  # BF16 r < L0 (r itself unused)
    counts = torch.poisson(torch.ones(8, n, dtype=d), generator=g)
    t = max(1, round(t_share * n))
    extra = (counts[:, t:] * clipped[t:]).sum(1)  # beyond T only the clipped tokens' counts matter
    values, reached = replicate_targets(xs[:t], clipped[:t], counts[:, :t], extra)
    for b in range(8):
        keep = counts[b].long()
        r8 = xs.repeat_interleave(keep)
        r16 = torch.where(clipped > 0, 0.5, 1.0).double().repeat_interleave(keep)
        if r8.numel() == 0 or (not reached[b] and t < n):
            continue  # an empty resample; or the answer lies beyond T (the caller widens T)
        if counts[b, :t].sum() == 0:
            assert math.isnan(values[b])
            continue
        assert float(values[b]) == pytest.approx(lower_target(r8, r16, 0.8)[0], rel=1e-12)


def _population(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    r16 = torch.exp(0.1 * torch.randn(n, generator=g, dtype=d))
    return r16 * (1 + 0.04 * torch.randn(n, generator=g, dtype=d)), r16


@pytest.mark.parametrize("n", [500, 2000])
def test_interval_width_matches_the_true_sampling_spread_of_L_target(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    draws = torch.tensor([lower_target(*_population(n, g), 0.8)[0] for _ in range(400)], dtype=d)
    true_lo, true_hi = torch.quantile(draws, torch.tensor([0.05, 0.95], dtype=d)).tolist()
    widths = []
    for k in range(5):  # one bootstrap interval per independent sample
        r8, r16 = _population(n, g)
        ci = lower_target_interval(r8, r16, 0.8, samples=400, seed=k)
        assert ci.replicates == 400 and ci.lo <= lower_target(r8, r16, 0.8)[0] <= ci.hi
        widths.append(ci.hi - ci.lo)
    ratio = (sum(widths) / len(widths)) / (true_hi - true_lo)
    assert 0.6 < ratio < 1.6, f"bootstrap width / true 90 % spread = {ratio:.2f}"


def test_interval_when_clipped_tokens_are_spread_over_all_ratios() -> None:
    # r̃ unrelated to r: the clipped tokens lie anywhere in the r̃ order, T must grow past 2m + 64
    g = torch.Generator().manual_seed(0)
    r8 = 0.5 + torch.rand(3000, generator=g, dtype=d)
    r16 = torch.where(torch.rand(3000, generator=g) < 0.3, 0.5, 1.0).double()
    ci = lower_target_interval(r8, r16, 0.8, samples=300)
    assert ci.replicates == 300 and ci.lo < lower_target(r8, r16, 0.8)[0] < ci.hi


def test_interval_edge_cases_and_errors() -> None:
    empty = torch.zeros(0, dtype=d)
    assert math.isnan(lower_target_interval(empty, empty, 0.8).lo)
    assert lower_target_interval(torch.ones(3), torch.ones(3), 0.8, samples=0).replicates == 0
    ci = lower_target_interval(torch.tensor([0.1, 0.2]), torch.tensor([0.1, 0.2]), 0.8)
    assert ci.lo == pytest.approx(0.1 * (1 + 1e-6)) and ci.hi == pytest.approx(0.2 * (1 + 1e-6))
    with pytest.raises(ValueError, match="level"):
        lower_target_interval(torch.ones(3), torch.ones(3), 0.8, level=1.0)
    with pytest.raises(ValueError, match="same negative-advantage tokens"):
        lower_target_interval(torch.ones(3), torch.ones(2), 0.8)
