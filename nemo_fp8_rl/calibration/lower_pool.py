"""Pooling calibration windows until the lower bound L* rests on enough BF16-clipped tokens.

L* is the (M+1)-th smallest FP8 ratio over the negative-advantage tokens N⁻, where M is the
number of them the BF16 ratio puts below L0 (`bounds.lower_target`). When BF16 clips almost
nothing (M of 1–2 per window, as in short CPU runs with small updates) one window's L* is
mostly sampling noise. Rule:

    pool = the most recent windows (the current one included) whose BF16-clipped counts add up
           to at least m_min, or the last `max_windows` windows if they never do;
    M = Σ m_w,  L* = (M+1)-th smallest r̃ over the pooled N⁻,  weight = min(1, M / m_min)

(m_min = `min_clipped_tokens`; 0 means one window, weight 1). A window that clips m_min or more
on its own is pooled with nothing, so on large runs the rule is the per-window one. Older
windows leave the pool as soon as newer ones carry m_min: the estimate uses no more history
than it needs, and never more than `max_windows` windows (the policy moves between them).

Memory: per window only the smallest `m_w + m_min·max_windows + 64` FP8 ratios of N⁻ are kept
(and m_w, n_w); the pooled (M+1)-th value is exact whenever it is below the largest value kept
by every truncated window, which holds unless an old window clipped far more than the newer
ones together; then the oldest windows are dropped until it holds (`target` says how many
windows it used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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

    def __init__(self, nominal_low: float, min_clipped: int, max_windows: int) -> None:
        if max_windows < 1 or min_clipped < 0:
            raise ValueError(
                f"LowerPool: need max_windows >= 1 and min_clipped >= 0, got {max_windows}, "
                f"{min_clipped}"
            )
        self.nominal_low, self.min_clipped, self.max_windows = nominal_low, min_clipped, max_windows
        self.windows: list[Window] = []

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
        self.windows.append(Window(step, m, int(fp8_neg.numel()), ordered))
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
        else:
            low = float(xs[clipped])
        weight = 1.0 if self.min_clipped == 0 else min(1.0, clipped / self.min_clipped)
        interval = lower_target_interval(xs[xs <= exact_up_to], clipped, tokens, level)
        return PooledTarget(low, clipped, tokens, len(used), weight, interval)

    def state_dict(self) -> list[dict[str, Any]]:
        """The pooled windows as plain lists (JSON-safe; at most a few hundred values each)."""
        return [
            {"step": w.step, "m": w.m, "n": w.n, "smallest": w.smallest.tolist()}
            for w in self.windows
        ]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """Restore `state_dict()` output."""
        self.windows = [
            Window(
                int(w["step"]),
                int(w["m"]),
                int(w["n"]),
                torch.tensor(w["smallest"], dtype=torch.float64),
            )
            for w in state
        ]


def _merged(windows: list[Window]) -> tuple[torch.Tensor, float]:
    """Pooled kept values, ascending, and the largest value below which none is missing."""
    xs = torch.sort(torch.cat([w.smallest for w in windows])).values
    limits = [float(w.smallest[-1]) for w in windows if w.truncated]
    return xs, min(limits, default=math.inf)
