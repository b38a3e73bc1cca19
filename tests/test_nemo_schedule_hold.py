"""Holding Megatron-Core's LR scheduler across a split step (real OptimizerParamScheduler, CPU)."""

from __future__ import annotations

import pytest
import torch
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from nemo_fp8_rl.engines.nemo.worker.schedule_hold import ScheduleHold


def _scheduler() -> OptimizerParamScheduler:
    """Linear warm-up from 0 to 1e-3 over 10 ticks, on a plain torch optimiser."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.0)
    return OptimizerParamScheduler(
        opt,
        init_lr=0.0,
        max_lr=1e-3,
        min_lr=0.0,
        lr_warmup_steps=10,
        lr_decay_steps=100,
        lr_decay_style="constant",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=100,
        wd_incr_style="constant",
    )


def test_held_scheduler_ticks_once_per_split_step() -> None:
    split, plain, hold = _scheduler(), _scheduler(), ScheduleHold()
    for _ in range(3):  # three GRPO steps, each split into four train() calls
        for call in range(4):
            hold.set(split, call < 3)
            split.step(increment=1)
        hold.set(split, False)
        plain.step(increment=1)
        assert split.num_steps == plain.num_steps
        assert split.optimizer.param_groups[0]["lr"] == pytest.approx(
            plain.optimizer.param_groups[0]["lr"]
        )
    assert plain.num_steps == 3 and plain.optimizer.param_groups[0]["lr"] > 0


def test_hold_and_release_are_idempotent_and_restore_the_class_method() -> None:
    sched, hold = _scheduler(), ScheduleHold()
    assert hold.set(sched, True) and not hold.set(sched, True) and hold.held
    sched.step(increment=1)
    assert sched.num_steps == 0
    assert hold.set(sched, False) and not hold.set(sched, False)
    assert "step" not in vars(sched)
    sched.step(increment=1)
    assert sched.num_steps == 1


def test_object_without_step_is_refused() -> None:
    with pytest.raises(TypeError, match="no step"):
        ScheduleHold().set(object(), True)
