"""GRPO advantages with NeMo RL's per-prompt baseline (leave-one-out optional).

For the `n` samples of one prompt with valid mask `v` and rewards `r`:
- leave-one-out: `b_i = sum_{j != i} v_j r_j / (n_v - 1)`, `s2_i = sum_{j != i} v_j r_j^2 / (n_v - 1)`;
  otherwise the same sums over all `j` divided by `n_v`;
- `std_i = sqrt((s2_i - b_i^2) * m / (m - 1))` with `m` the divisor above (NaN -> 0);
- a group with at most one valid sample gets `b_i = r_i` (advantage 0).
Advantage `A_i = r_i - b_i`, divided by `std_i + 1e-6` where `std_i > 0` if `normalize_rewards`.
"""

from __future__ import annotations

import torch


def baseline_and_std(
    rewards: torch.Tensor,
    group_size: int,
    valid: torch.Tensor | None = None,
    *,
    leave_one_out: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and std for rewards laid out as consecutive groups of `group_size`."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    r = rewards.view(-1, group_size).double()
    v = torch.ones_like(r) if valid is None else valid.view(-1, group_size).double()
    sum_r, sum_r2 = (r * v).sum(1, keepdim=True), (r * r * v).sum(1, keepdim=True)
    n_v = v.sum(1, keepdim=True)
    if leave_one_out:
        m = n_v - 1
        base, sq = (sum_r - r * v) / m, (sum_r2 - r * r * v) / m
    else:
        m = n_v
        base, sq = sum_r.expand_as(r) / m, sum_r2.expand_as(r) / m
    std = ((sq - base.square()) * m / (m - 1)).clamp(min=0).sqrt().nan_to_num(0.0)
    few = (n_v <= 1).expand_as(r)
    base = torch.where(few, r, base)
    std = torch.where(few, torch.zeros_like(std), std)
    return base.flatten().to(rewards.dtype), std.flatten().to(rewards.dtype)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, leave_one_out: bool, normalize: bool
) -> torch.Tensor:
    """Sequence-level GRPO advantages `[N]` (broadcast over response tokens by the caller)."""
    base, std = baseline_and_std(rewards, group_size, leave_one_out=leave_one_out)
    adv = rewards - base
    if normalize:
        nz = std > 0
        adv = torch.where(nz, adv / (std + 1e-6), adv)
    return adv
