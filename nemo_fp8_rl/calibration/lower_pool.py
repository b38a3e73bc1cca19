"""Pooling calibration windows for the lower bound L*, with a boundary fixed in advance.

L* matches a quantile: the level p = P(r < L0) of the BF16 ratio r on the negative-advantage
tokens N⁻, found in the FP8 ratios r̃ of the same tokens (`bounds.lower_target`). With M of the
N pooled tokens below L0 in BF16 and x_(1) ≤ … ≤ x_(N) the pooled FP8 ratios, two rules:

`fixed_windows` (the default):

    pool = the latest W windows (W = `max_pool_windows`), whatever they clipped; the run's first
           window (right after the warm-up, whose clipping is not yet the run's) only while it
           is the only one
    L* = x_(M) + (M/N)·(x_(M+1) − x_(M))   (x_(1)·(1 − margin) when M = 0),
    weight = min(1, M / m_min)

The boundary does not depend on the counts, so M ~ Binomial(N, p) and the level of x_(k),
Beta(k, N+1−k), has mean k/(N+1): at rank M + M/N its mean is p, so L* matches the quantile
without the rank bias of x_(M+1), whose level is p + (1−p)/(N+1) on average, a relative excess of
about 1/M (100 % at M ≈ 1).

`until_min_clipped` (the rule before; kept so that older runs can be reproduced):

    pool = the most recent windows whose BF16-clipped counts add up to at least m_min, or the
           last W windows if they never do;  L* = x_(M+1)

Its boundary depends on the outcome (the oldest pooled window always clipped something, so M
over-represents clipping), and x_(M+1) adds the rank bias: L* leans high, i.e. towards
under-correcting FP8's extra clipping. `scripts/lower_pool_simulation.py` measures both rules
(bias of the matched level, coverage of the interval); `tests/test_lower_pool_rule.py` checks
the fixed rule's bias is below a tenth of the old rule's at m = 1–16 clipped tokens per window.

The 90 % interval (`order_interval`) is computed from the pooled M and N either way.
Memory: per window only the smallest `m_w + m_min·W + 64` FP8 ratios of N⁻ are kept (and m_w,
n_w); the pooled x_(M+1) is exact whenever it is below the largest value kept by every truncated
window, which holds unless an old window clipped far more than the newer ones together; then
the oldest windows are dropped until it holds (`target` says how many windows it used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from nemo_fp8_rl.calibration.bounds import EDGE_MARGIN
from nemo_fp8_rl.calibration.order_interval import LowerInterval, lower_target_interval

MARGIN = 64


@dataclass(frozen=True)
class Window:
    """One calibration window's N⁻: BF16-clipped count m, size n, smallest FP8 ratios (ascending)."""

    step: int
    m: int
    n: int
    smallest: torch.Tensor
    first: bool = False  # the run's first window (right after the warm-up)

    @property
    def truncated(self) -> bool:
        return self.smallest.numel() < self.n


@dataclass(frozen=True)
class PooledTarget:
    """L* over the pooled windows, the counts it rests on, its weight and interval."""

    low_target: float
    clipped: int
    tokens: int
    windows: int
    weight: float
    interval: LowerInterval


class LowerPool:
    """The pooled windows of N⁻ statistics behind L* (see the module docstring)."""

    def __init__(
        self,
        nominal_low: float,
        min_clipped: int,
        max_windows: int,
        rule: Literal["fixed_windows", "until_min_clipped"] = "fixed_windows",
    ) -> None:
        if max_windows < 1 or min_clipped < 0:
            raise ValueError(
                f"LowerPool: need max_windows >= 1 and min_clipped >= 0, got {max_windows}, "
                f"{min_clipped}"
            )
        if rule not in ("fixed_windows", "until_min_clipped"):
            raise ValueError(f"LowerPool: unknown rule {rule!r}")
        self.nominal_low, self.min_clipped, self.max_windows = nominal_low, min_clipped, max_windows
        self.rule = rule
        self.windows: list[Window] = []
        self.added = 0

    def add(self, step: int, fp8_neg: torch.Tensor, bf16_neg: torch.Tensor) -> None:
        """Add one window's N⁻ ratios (FP8 and BF16, same tokens) and drop what is not needed."""
        if fp8_neg.numel() != bf16_neg.numel() or fp8_neg.numel() == 0:
            raise ValueError(
                f"LowerPool.add: need the same non-empty N⁻ in both precisions, got "
                f"{fp8_neg.numel()} FP8 and {bf16_neg.numel()} BF16 ratios"
            )
        m = int((bf16_neg < self.nominal_low).sum())
        keep = m + self.min_clipped * self.max_windows + MARGIN
        ordered = torch.sort(fp8_neg.double().reshape(-1)).values[:keep].clone()
        self.windows.append(Window(step, m, int(fp8_neg.numel()), ordered, self.added == 0))
        self.added += 1
        if self.rule == "fixed_windows":
            self.windows = [w for w in self.windows if not (w.first and len(self.windows) > 1)]
            del self.windows[: max(0, len(self.windows) - self.max_windows)]
            return
        while len(self.windows) > self.max_windows or (
            len(self.windows) > 1 and sum(w.m for w in self.windows[1:]) >= self.min_clipped
        ):
            self.windows.pop(0)

    def target(self, level: float = 0.9) -> PooledTarget:
        """L* over the pool (newest windows whose kept values make it exact), weight, interval."""
        if not self.windows:
            raise ValueError("LowerPool.target: no window added yet")
        for first in range(len(self.windows)):
            used = self.windows[first:]
            xs, exact_up_to = _merged(used)
            clipped, tokens = sum(w.m for w in used), sum(w.n for w in used)
            if clipped >= tokens or float(xs[clipped]) <= exact_up_to:
                break
        if clipped == 0:
            low = float(xs[0]) * (1.0 - EDGE_MARGIN)
        elif clipped >= tokens:
            low = float(xs[-1]) * (1.0 + EDGE_MARGIN)
        elif self.rule == "fixed_windows":  # x_(M) + (M/N)(x_(M+1) − x_(M)): mean level p
            below, above = float(xs[clipped - 1]), float(xs[clipped])
            low = below + clipped / tokens * (above - below)
        else:
            low = float(xs[clipped])  # x_(M+1)
        weight = 1.0 if self.min_clipped == 0 else min(1.0, clipped / self.min_clipped)
        interval = lower_target_interval(xs[xs <= exact_up_to], clipped, tokens, level)
        return PooledTarget(low, clipped, tokens, len(used), weight, interval)

    def state_dict(self) -> list[dict[str, Any]]:
        """The pooled windows as plain lists (JSON-safe; at most a few hundred values each),
        the last one carrying how many windows were ever added."""
        out = [
            {"step": w.step, "m": w.m, "n": w.n, "smallest": w.smallest.tolist(), "first": w.first}
            for w in self.windows
        ]
        if out:
            out[-1]["added"] = self.added
        return out

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Restore `state_dict()` output (states without `first`/`added` count as later ones)."""
        self.windows = [
            Window(
                int(w["step"]),
                int(w["m"]),
                int(w["n"]),
                torch.tensor(w["smallest"], dtype=torch.float64),
                bool(w.get("first", False)),
            )
            for w in state
        ]
        self.added = int(state[-1].get("added", len(state))) if state else 0


def _merged(windows: list[Window]) -> tuple[torch.Tensor, float]:
    """Pooled kept values, ascending, and the largest value below which none is missing."""
    xs = torch.sort(torch.cat([w.smallest for w in windows])).values
    limits = [float(w.smallest[-1]) for w in windows if w.truncated]
    return xs, min(limits, default=math.inf)
