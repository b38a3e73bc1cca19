"""The L* pool rule whose boundary does not depend on the outcome (`pool_rule: fixed_windows`):
the vectorised simulation of it is `LowerPool` itself, the run's first window leaves the pool,
and its bias on the matched quantile is below a tenth of the old rule's
(`scripts/lower_pool_simulation.py`, whose full table is in docs/calibrated-clipping.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import lower_pool_simulation as sim  # noqa: E402

from nemo_fp8_rl.calibration.lower_pool import LowerPool  # noqa: E402

SIGMA = sim.fp8_sigma(sim.measured_quotient())


def test_vectorised_fixed_pool_is_lower_pool():
    """One pool of W windows after the first: `fixed_pool_estimates` gives LowerPool's L* and M."""
    model = sim.Model(2, SIGMA)
    g = torch.Generator().manual_seed(4)
    pool = LowerPool(sim.L0, sim.M_MIN, sim.W, "fixed_windows")
    windows = [model.draw(g, (sim.N_WINDOW,)) for _ in range(sim.W + 1)]
    for k, (fp8, bf16) in enumerate(windows):
        pool.add(k, fp8, bf16)
    assert [w.step for w in pool.windows] == list(range(1, sim.W + 1))
    fp8 = torch.cat([f for f, _ in windows[1:]])[None]
    bf16 = torch.cat([b for _, b in windows[1:]])[None]
    low, m = sim.fixed_pool_estimates(fp8, bf16)
    target = pool.target()
    assert target.clipped == int(m) and target.low_target == pytest.approx(float(low), rel=1e-12)


def test_first_window_stays_only_while_alone():
    """The run's first window (after the warm-up) is L*'s only data until a second arrives."""
    model = sim.Model(1, SIGMA)
    g = torch.Generator().manual_seed(5)
    pool = LowerPool(sim.L0, sim.M_MIN, sim.W, "fixed_windows")
    pool.add(0, *model.draw(g, (sim.N_WINDOW,), m=11))
    assert [w.step for w in pool.windows] == [0]
    pool.add(5, *model.draw(g, (sim.N_WINDOW,)))
    assert [w.step for w in pool.windows] == [5]


def _check(m: int, chains: int, pools: int, coverage_pools: int) -> None:
    """|bias| of the fixed rule < 0.1·|bias| of the old one, both measured (old: `chains` runs
    of LowerPool; fixed: `pools` pools), the interval's coverage ≥ 0.88 under both."""
    model = sim.Model(m, SIGMA)
    old = sim.simulate_chain("until_min_clipped", model, chains=chains, seed=m)
    new = sim.simulate_fixed(model, pools=pools, seed=m, coverage_pools=coverage_pools)
    assert old.bias > 3 * old.se  # the old rule's bias is there, and leans high
    assert abs(new.bias) < 0.1 * old.bias, (old, new)
    assert new.coverage >= 0.88 and old.coverage >= 0.88


def test_fixed_rule_bias_is_below_a_tenth_of_the_old_rule():
    """At m = 16 clipped tokens per window (the old rule then pools one window)."""
    _check(16, chains=100, pools=4000, coverage_pools=500)


@pytest.mark.slow
@pytest.mark.parametrize("m", [2, 4, 8])
def test_fixed_rule_bias_at_few_clipped_tokens(m):
    """The same at m = 2–8, with the script's sample sizes (about a minute each). At m = 1 the
    measured quotient is 0.105 (docs/calibrated-clipping.md): not below a tenth, so not held."""
    _check(m, chains=600, pools=20_000, coverage_pools=2000)


def test_warmup_window_no_longer_biases_the_early_calibrations():
    """First window ×11 (the committed study's first window after the warm-up): over the 16
    calibrations after it the old rule keeps it and leans high; the fixed rule drops it."""
    model = sim.Model(1, SIGMA)
    old = sim.simulate_chain("until_min_clipped", model, chains=60, seed=1, warmup=True)
    new = sim.simulate_chain("fixed_windows", model, chains=60, seed=1, warmup=True)
    assert old.bias > 0.15 and abs(new.bias) < old.bias / 3, (old, new)
