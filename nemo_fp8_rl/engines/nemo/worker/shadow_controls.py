"""The two worker methods the BF16 shadow passes call, for any Megatron policy worker.

`ShadowPolicy` (driver side) calls `set_fp8_compute` around the BF16 log-prob pass and
`hold_lr_schedule` around the `train` calls of a split calibration step. A worker class gets
both by mixing this class in; it needs `self.model` (its model chunks) and `self.scheduler`
(Megatron-Core's `OptimizerParamScheduler`). Used by NeMo RL's Megatron worker subclass
(`worker.ShadowWorkerImpl`) and by the CPU loop's worker (`cpu.policy_worker`).
"""

from __future__ import annotations

from nemo_fp8_rl.engines.nemo.worker.fp8_switch import Fp8ComputeSwitch
from nemo_fp8_rl.engines.nemo.worker.schedule_hold import ScheduleHold


class ShadowControls:
    """`set_fp8_compute` and `hold_lr_schedule` (module docstring)."""

    def set_fp8_compute(self, enabled: bool) -> int:
        """FP8 compute on or off for this rank's model chunks; returns configs changed."""
        if not hasattr(self, "_fp8_switch"):
            self._fp8_switch = Fp8ComputeSwitch()
        return self._fp8_switch.set(self.model, enabled)  # type: ignore[attr-defined]

    def hold_lr_schedule(self, hold: bool) -> bool:
        """Hold (True) or release (False) this rank's LR/WD scheduler; returns whether it changed."""
        if not hasattr(self, "_schedule_hold"):
            self._schedule_hold = ScheduleHold()
        return self._schedule_hold.set(self.scheduler, hold)  # type: ignore[attr-defined]
