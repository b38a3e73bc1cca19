"""Hold a Megatron-Core learning-rate scheduler still across a split training step.

NeMo RL's Megatron worker ticks its `OptimizerParamScheduler` once per `train()` call (one GRPO
step), not once per optimiser step. On an `in_loop` calibration step the engine splits the
step's n global batches into n `train()` calls, which would tick the schedule n times. Holding
the scheduler for the first n-1 calls keeps the learning-rate and weight-decay schedule exactly
as in an unsplit step: every global batch of the step uses the same values, and the schedule
advances once, after the last.

The hold replaces `step` on the scheduler instance only (the class is untouched) and is undone
by `release`; holding or releasing twice is harmless.
"""

from __future__ import annotations

from typing import Any


def _no_tick(*args: Any, **kwargs: Any) -> None:
    """Stands in for `scheduler.step` while the schedule is held."""


class ScheduleHold:
    """Hold (`set(scheduler, True)`) or release (`False`) one scheduler's `step`."""

    def __init__(self) -> None:
        self._held: Any = None
        self._own_step: Any = None  # an instance-level `step` that was there before the hold

    @property
    def held(self) -> bool:
        return self._held is not None

    def set(self, scheduler: Any, hold: bool) -> bool:
        """Hold or release `scheduler`; returns whether anything changed."""
        if hold == self.held:
            return False
        if hold:
            if not callable(getattr(scheduler, "step", None)):
                raise TypeError(f"{type(scheduler).__name__} has no step() to hold")
            self._own_step = vars(scheduler).get("step")
            scheduler.step = _no_tick
            self._held = scheduler
        else:
            if self._own_step is None:
                del self._held.step  # the class's own step() is visible again
            else:
                self._held.step = self._own_step
            self._held, self._own_step = None, None
        return True
