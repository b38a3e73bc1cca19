"""BF16 shadow passes and calibration around NeMo RL's `policy.train` (driver side).

`ShadowPolicy` wraps NeMo RL's `Policy` and is what `grpo_train` receives. Every attribute is
the wrapped policy's except `train` and `save_checkpoint`. On every step `train` adds the
per-sign clip fractions (`clip_lower_frac_neg`, `clip_upper_frac_pos`, `clip_dual_frac_neg`). On a calibration step k
(`calibrator.is_calibration_step(k)`), with N rollout samples and G = train_global_batch_size
(n = N / G optimiser steps; NeMo RL's global batch j is rows [jG, (j+1)G)):

`in_loop` (default, spec §2.6):
    ℓ16_old = BF16 log-probs of the whole batch, before any update (θ_old)
    for j in 0..n-1:
        ℓ16_cur = ℓ16_old[j] if j == 0 else BF16 log-probs of mini-batch j (weights θ_j)
        policy.train(mini-batch j + {bf16_prev_logprobs, bf16_curr_logprobs})
    The loss sees FP8 log-probs of θ_j on the same tokens, so r = exp(ℓ16_cur − ℓ16_old) and
    r̃ = exp(ℓ8_cur − ℓ8_old) are measured at exactly the weights the clip acts on. Cost:
    one BF16 pass over the batch plus n−1 over mini-batches, i.e. two BF16 forwards per token.

`end_of_step`:
    ℓ16_old, then the usual single `policy.train`, then ℓ16_new (θ_new) and one forward-only
    `policy.train(eval_mode=True)` with the shadow keys, whose loss observes r̃ with θ_new.

The workers' loss returns the observations in its metrics (see `observations`); they are
replayed here into the driver's calibrator, which pools every data-parallel rank, and
`update(k)` moves (L, H). The loss object, pickled again for the next `policy.train`, carries the
new bounds to every worker: bounds computed at step k apply from step k+1 (lagged, §2.6).

Splitting the step into n `policy.train` calls changes nothing the optimiser sees: one global
batch per call, and the workers' LR schedule (which NeMo RL ticks once per `train` call) held
for the first n-1 calls (`schedule_hold`). `merge_train_results` (train_results) rebuilds the
single-call result: losses, per-micro-batch metrics, MoE/MTP means and FLOP counts.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.engines.nemo.driver.checkpoint import save_calibrator_state
from nemo_fp8_rl.engines.nemo.driver.train_results import merge_train_results
from nemo_fp8_rl.engines.nemo.worker.loss import BF16_CURR, BF16_PREV
from nemo_fp8_rl.engines.nemo.worker.observations import PAYLOAD_KEY, ShadowObservations
from nemo_fp8_rl.loss import derive_sign_fractions

PrecisionSwitch = Callable[[bool], None]
ScheduleControl = Callable[[bool], None]
# Calibrator statistics logged once per calibration step (the bounds in force, `calib_low` /
# `calib_high`, come from the loss as summable per-micro-batch shares).
_UPDATE_SKIP = frozenset({"calib_low", "calib_high"})
_SIGN_PARTS = frozenset(
    {"clip_lower_frac", "clip_upper_frac", "clip_dual_frac", "neg_token_frac", "pos_token_frac"}
)


def minibatch_bounds(batch_size: int, global_batch_size: int) -> list[tuple[int, int]]:
    """Row ranges of NeMo RL's global batches: [(0, G), (G, 2G), ...]; N must be a multiple of G."""
    if global_batch_size < 1 or batch_size % global_batch_size:
        raise ValueError(
            f"the rollout batch ({batch_size} samples) is not a multiple of "
            f"policy.train_global_batch_size ({global_batch_size}); NeMo RL requires it. Set "
            "grpo.num_prompts_per_step x grpo.num_generations_per_prompt to a multiple of it"
        )
    return [(s, s + global_batch_size) for s in range(0, batch_size, global_batch_size)]


def pop_observations(results: dict[str, Any]) -> ShadowObservations:
    """Remove the shadow payload from `policy.train` results and join it (all ranks, all micro-batches)."""
    values = results.get("all_mb_metrics", {}).pop(PAYLOAD_KEY, [])
    return sum(values, ShadowObservations())


def worker_precision_switch(policy: Any) -> PrecisionSwitch:
    """Switch FP8 compute on/off in every policy worker (`ShadowMegatronPolicyWorker.set_fp8_compute`)."""
    import ray

    def switch(enabled: bool) -> None:
        ray.get(policy.worker_group.run_all_workers_single_data("set_fp8_compute", enabled=enabled))

    return switch


def worker_schedule_hold(policy: Any) -> ScheduleControl:
    """Hold/release the LR schedule in every policy worker (`...Worker.hold_lr_schedule`)."""
    import ray

    def hold(held: bool) -> None:
        ray.get(policy.worker_group.run_all_workers_single_data("hold_lr_schedule", hold=held))

    return hold


class ShadowPolicy:
    """NeMo RL `Policy` with BF16 shadow passes and calibration on calibration steps.

    Args:
        policy: NeMo RL's policy (workers built with the shadow worker extension).
        loss_fn: the loss `grpo_train` passes to `train` (its `calibrator` is the authority).
        start_step: steps already done (0, or NeMo RL's `total_steps` when resuming).
        global_batch_size: `policy.train_global_batch_size`.
        switch: turns FP8 compute in the workers on (True) or off (False).
        hold_schedule: holds (True) or releases (False) the workers' LR schedule, so that a
            split step ticks it once, like NeMo RL's single `train` call does.
    """

    def __init__(
        self,
        policy: Any,
        loss_fn: Any,
        *,
        start_step: int,
        global_batch_size: int,
        switch: PrecisionSwitch,
        hold_schedule: ScheduleControl,
    ) -> None:
        self._policy = policy
        self._loss_fn = loss_fn
        self.step = start_step
        self.global_batch_size = global_batch_size
        self._switch = switch
        self._hold_schedule = hold_schedule
        cal = loss_fn.calibrator
        self.mode = cal.cfg.mode if cal is not None else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._policy, name)

    # ---- shadow passes --------------------------------------------------------------------
    def bf16_logprobs(self, data: Any, timer: Any = None) -> torch.Tensor:
        """[B, S] log-probs of the current weights with FP8 compute off (policy's logprob path)."""
        self._switch(False)
        try:
            return self._policy.get_logprobs(data, timer=timer)["logprobs"]
        finally:
            self._switch(True)

    @staticmethod
    def _timed(timer: Any, label: str) -> contextlib.AbstractContextManager:
        return timer.time(label) if timer is not None else contextlib.nullcontext()

    # ---- training -------------------------------------------------------------------------
    def train(self, data: Any, loss_fn: Any, eval_mode: bool = False, **kwargs: Any) -> dict:
        """NeMo RL's `policy.train`, plus the shadow passes and calibrator update of this step."""
        if eval_mode:
            return self._policy.train(data, loss_fn, eval_mode=True, **kwargs)
        step, self.step = self.step, self.step + 1
        cal = getattr(loss_fn, "calibrator", None)
        if cal is None:
            return self._with_metrics(self._policy.train(data, loss_fn, **kwargs), {})
        if not cal.is_calibration_step(step):
            results = self._policy.train(data, loss_fn, **kwargs)
            stray = pop_observations(results)
            if len(stray):
                raise RuntimeError(
                    f"shadow statistics arrived on step {step}, not a calibration step"
                )
            return self._with_metrics(results, cal.update(step))
        timer = kwargs.get("timer")
        if self.mode == "end_of_step":
            results, observed = self._end_of_step(data, loss_fn, kwargs, timer)
        else:
            results, observed = self._in_loop(data, loss_fn, kwargs, timer)
        observed.replay(cal)
        update = cal.update(step)
        update["shadow_tokens"] = float(observed.num_tokens)
        return self._with_metrics(results, update)

    def _in_loop(self, data, loss_fn, kwargs, timer) -> tuple[dict, ShadowObservations]:
        gbs = kwargs.get("gbs") or self.global_batch_size
        with self._timed(timer, "shadow"):
            bf16_old = self.bf16_logprobs(data, timer)
        bounds = minibatch_bounds(bf16_old.shape[0], gbs)
        parts = []
        try:
            for j, (lo, hi) in enumerate(bounds):
                part = data.slice(lo, hi)
                if j == 0:
                    bf16_cur = bf16_old[lo:hi]
                else:
                    with self._timed(timer, "shadow"):
                        bf16_cur = self.bf16_logprobs(part, timer)
                part[BF16_PREV], part[BF16_CURR] = bf16_old[lo:hi], bf16_cur
                self._hold_schedule(j < len(bounds) - 1)  # one LR tick per step, after the last
                parts.append(self._policy.train(part, loss_fn, **kwargs))
        finally:
            self._hold_schedule(False)
        observed = sum((pop_observations(p) for p in parts), ShadowObservations())
        return merge_train_results(parts), observed

    def _end_of_step(self, data, loss_fn, kwargs, timer) -> tuple[dict, ShadowObservations]:
        with self._timed(timer, "shadow"):
            bf16_old = self.bf16_logprobs(data, timer)
        results = self._policy.train(data, loss_fn, **kwargs)
        with self._timed(timer, "shadow"):
            shadow = copy.copy(data)
            shadow[BF16_PREV], shadow[BF16_CURR] = bf16_old, self.bf16_logprobs(data, timer)
            probe = self._policy.train(shadow, loss_fn, eval_mode=True, **kwargs)
        return results, pop_observations(probe)

    @staticmethod
    def _with_metrics(results: dict, update: dict[str, float]) -> dict:
        """Add per-step values as one-element lists (NeMo RL sums lists before logging).

        The values: the calibrator's update, and the per-sign clip fractions, which are ratios
        of sums over all micro-batches (`derive_sign_fractions`), so they cannot come from the
        loss's summable per-micro-batch metrics.
        """
        metrics = results.setdefault("all_mb_metrics", {})
        summed = {k: float(sum(v)) for k, v in metrics.items() if k in _SIGN_PARTS}
        for key, value in {**update, **derive_sign_fractions(summed)}.items():
            if key not in _UPDATE_SKIP:
                metrics[key] = [float(value)]
        return results

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, weights_path: str, *args: Any, **kwargs: Any) -> Any:
        """NeMo RL's checkpoint plus the calibrator state, in the same (temporary) step folder."""
        cal = self._loss_fn.calibrator
        if cal is not None:
            save_calibrator_state(cal, Path(weights_path).parents[1])
        return self._policy.save_checkpoint(weights_path, *args, **kwargs)
