"""`Calibrator`: the state of Calibrated Clipping across steps (bounds, schedule, history).

Life of one calibration step k (`is_calibration_step(k)`): the trainer runs the two BF16 shadow
passes, the loss (or the engine) calls `observe(...)` once per micro-batch, and after the step's
last optimiser update the engine calls `update(k, gather)`. The statistics are pooled over all
data-parallel ranks through `gather`, so every rank derives identical bounds, which are used from
step k+1 on (lagged application, ambiguity A3) until the next calibration step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from nemo_fp8_rl.calibration.bounds import (
    EDGE_MARGIN,
    Samples,
    lower_clip_fraction,
    prepare_rows,
    samples_from_rows,
    smooth_and_cap,
    update_balance,
    upper_target,
)
from nemo_fp8_rl.calibration.diagnostics import overclip_stats
from nemo_fp8_rl.calibration.lower_pool import LowerPool
from nemo_fp8_rl.config.project import CalibrationConfig

Gather = Callable[[torch.Tensor], torch.Tensor]
#: Per-step sums: Σ|p̃ − p|, Σp, dropped tokens, Σ r·|p̃/p − 1|, Σ r (θ pass, valid tokens).
SUMS = 5
_STATE_VERSION = 2  # 2: the pooled windows behind L* (version 1 states load with an empty pool)


def all_gather_rows(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Concatenate a [n, k] tensor over all ranks of `group` along dim 0, in rank order.

    `n` may differ between ranks (rows are padded to the largest n for `all_gather`, then
    trimmed). Use as `cal.update(step, gather=all_gather_rows)` under `torch.distributed`;
    with NCCL, `t` must be on the rank's CUDA device.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    n = torch.tensor([t.shape[0]], device=t.device, dtype=torch.long)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    longest = int(max(int(s) for s in sizes))
    padded = t.new_zeros((longest, *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes, strict=True)], dim=0)


def updates_per_rollout_batch(
    num_prompts_per_step: int, num_generations_per_prompt: int, train_global_batch_size: int
) -> int:
    """Optimiser steps per rollout batch: `prompts x generations / train_global_batch_size`.

    1 means θ = θ_old whenever the loss is evaluated, so clipping is structurally inactive.
    """
    samples = num_prompts_per_step * num_generations_per_prompt
    if train_global_batch_size < 1 or samples % train_global_batch_size:
        raise ValueError(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt = {samples} must be a "
            f"multiple of policy.train_global_batch_size = {train_global_batch_size}"
        )
    return samples // train_global_batch_size


class Calibrator:
    """Clip bounds (L, H) for the FP8 loss, re-derived from BF16 shadow passes every K steps.

    The update at a calibration step, from the pooled tokens and the bounds (L, H) in force
    (`docs/calibrated-clipping.md` states the rule and where it departs from the method):

        m    = #{N⁻ : r < L0},   α = m / |N⁻|       (this window)
        pool = the latest W = max_pool_windows windows (the first only while alone)
        M    = Σ_pool m,  N = Σ_pool |N⁻|,  L* = x_(M) + (M/N)(x_(M+1) − x_(M))  (x: pooled r̃)
        w    = min(1, M / m_min)                                   (m_min = min_clipped_tokens)
        L'   = clamp(L + clamp(w·β·(L* − L), ±δ_L), L_floor, L_ceil)       (the L in force next)
        ρ(h) = ρ(r̃; L', h),   ρ_best = min(ρ(r; L0, H0), ρ(H_max))
        H*   = min{ h ∈ [H_floor, H_max] : ρ(h) ≥ (1 − τ)·ρ_best }        (τ = rho_tolerance)
        H'   = clamp(H + clamp(β·(H* − H), ±δ_H), H_floor, H_max)

    H* is solved at L', the lower bound that will actually be in force, not at the raw L*: the
    negative mass N, hence the H needed, depends on it. H* is the narrowest bound at the best
    reachable balance, never the cap merely because ρ_ref is out of reach; a shortfall below τ
    does not widen H (dead-band). L* rests on the M BF16-clipped tokens; with few per window
    one window's L* is mostly sampling noise, so the latest W windows are pooled
    (`lower_pool`, whose boundary does not depend on the counts; `pool_rule: until_min_clipped`
    is the older, biased rule), and w < 1 while they hold fewer than m_min clipped tokens. Logged: m as
    `calib_bf16_lower_count_neg`, M, the pooled windows and w as `calib_low_pool_clipped`,
    `calib_low_pool_windows`, `calib_low_weight`, and the distribution-free 90 % interval of L*
    (`order_interval`) as `calib_low_target_ci90_{lo,hi,width}`. Fewer than `min_tokens`
    tokens in N⁻ or N⁺ skip the update (and add nothing to the pool).

    Args:
        cfg: the `loss_fn.calibration` section.
        ratio_clip_min, ratio_clip_max: NeMo RL's ε values; nominal bounds are
            `L0 = 1 - ratio_clip_min`, `H0 = 1 + ratio_clip_max`.
        ratio_clip_c: NeMo RL's dual-clip constant (None when off); tokens with A < 0 and
            ratio > c are excluded from the negative update mass in both precisions.
    """

    def __init__(
        self,
        cfg: CalibrationConfig,
        ratio_clip_min: float,
        ratio_clip_max: float,
        ratio_clip_c: float | None = None,
    ) -> None:
        if not 0.0 < ratio_clip_min < 1.0 or ratio_clip_max <= 0.0:
            raise ValueError(
                f"loss_fn.ratio_clip_min must be in (0, 1) and loss_fn.ratio_clip_max > 0 for "
                f"calibration, got {ratio_clip_min} and {ratio_clip_max}"
            )
        if ratio_clip_c is not None and ratio_clip_c <= 1.0:
            raise ValueError(f"loss_fn.ratio_clip_c must be > 1 or null, got {ratio_clip_c}")
        self.cfg = cfg
        self.nominal = (1.0 - ratio_clip_min, 1.0 + ratio_clip_max)
        self.dual_c = ratio_clip_c
        if cfg.high_max < self.nominal[1]:
            raise ValueError(
                f"loss_fn.calibration.high_max = {cfg.high_max} is below the nominal upper bound "
                f"1 + ratio_clip_max = {self.nominal[1]}; raise high_max or lower ratio_clip_max"
            )
        self._bounds = tuple(cfg.init_bounds) if cfg.init_bounds is not None else self.nominal
        self.lower_pool = LowerPool(
            self.nominal[0], cfg.min_clipped_tokens, cfg.max_pool_windows, cfg.pool_rule
        )
        self.last_calibration_step: int | None = None
        self.history: list[dict[str, float]] = []
        self.updates_per_step: int | None = None
        self._chunks: list[torch.Tensor] = []
        self._prob_sums: torch.Tensor | None = None
        self._device = torch.device("cpu")  # where observed statistics live (for `gather`)

    # ---- schedule -------------------------------------------------------------------------
    @property
    def bounds(self) -> tuple[float, float]:
        """(L, H) in force now: nominal or `init_bounds` until the first `update`."""
        return (float(self._bounds[0]), float(self._bounds[1]))

    def is_calibration_step(self, step: int) -> bool:
        """True on steps k ≥ start_step with (k − start_step) % interval == 0 (shadow passes run)."""
        start = self.cfg.start_step
        return self.cfg.enabled and step >= start and (step - start) % self.cfg.interval == 0

    def low_limits(self) -> tuple[float, float]:
        """(floor, ceiling) of L: [low_floor, L0] relax-only, up to just below 1 if tightening."""
        ceil = 1.0 - EDGE_MARGIN if self.cfg.allow_tighten else self.nominal[0]
        return self.cfg.low_floor, ceil

    def high_limits(self) -> tuple[float, float]:
        """(floor, ceiling) of H: [H0, high_max], or from just above 1 if `high_below_nominal`."""
        floor = 1.0 + EDGE_MARGIN if self.cfg.high_below_nominal else self.nominal[1]
        return floor, self.cfg.high_max

    def set_updates_per_step(self, updates_per_step: int) -> None:
        """Record the optimiser steps per rollout batch; warn if clipping is structurally inert.

        With one update per rollout batch the loss sees θ = θ_old, so r ≈ r̃ ≈ 1 apart from FP8
        run-to-run noise, and clipping (hence calibration) has almost nothing to act on.
        """
        if updates_per_step < 1:
            raise ValueError(f"updates_per_step must be ≥ 1, got {updates_per_step}")
        self.updates_per_step = updates_per_step
        if self.cfg.enabled and updates_per_step == 1:
            warnings.warn(
                "Calibrated Clipping is enabled but there is one optimiser step per rollout batch "
                "(num_prompts_per_step x num_generations_per_prompt == train_global_batch_size): "
                "the policy ratio stays ~1 and clipping is structurally inactive. Lower "
                "policy.train_global_batch_size to get several updates per step.",
                stacklevel=2,
            )

    # ---- accumulation ---------------------------------------------------------------------
    def observe(
        self,
        *,
        fp8_ratio: torch.Tensor,
        bf16_ratio: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        fp8_logprobs: torch.Tensor | None = None,
        bf16_logprobs: torch.Tensor | None = None,
    ) -> None:
        """Accumulate one micro-batch of calibration statistics (any shape, all the same shape).

        `weights` are the per-token loss weights w = aggregation weight x importance weight
        (default 1). `fp8_logprobs`/`bf16_logprobs` (optional, same weights θ) feed the
        probability NMAE `Σ|p̃ − p| / Σp` and the θ pass's error in the ratio's weighting,
        `single_pass_nmae = Σ r·|p̃/p − 1| / Σ r`; `ratio_compounding = ratio_nmae /
        single_pass_nmae` is √2 for independent errors of the two passes and 0 when they cancel.
        """
        if (fp8_logprobs is None) != (bf16_logprobs is None):
            raise ValueError("observe: pass both fp8_logprobs and bf16_logprobs, or neither")
        rows, dropped = prepare_rows(
            fp8_ratio, bf16_ratio, advantages, weights, mask, self.cfg.log_ratio_clamp
        )
        self._chunks.append(rows)
        self._device = rows.device
        sums = fp8_ratio.new_zeros(SUMS, dtype=torch.float64)
        sums[2] = dropped
        if fp8_logprobs is not None:
            p8, p16 = fp8_logprobs.detach().double().exp(), bf16_logprobs.detach().double().exp()
            r16 = bf16_ratio.detach().double()
            ok = torch.isfinite(p8) & torch.isfinite(p16) & torch.isfinite(r16)
            if mask is not None:
                ok &= mask > 0
            zero = torch.zeros((), dtype=torch.float64, device=p8.device)
            sums[0] = torch.where(ok, (p8 - p16).abs(), zero).sum()
            sums[1] = torch.where(ok, p16, zero).sum()
            sums[3] = torch.where(ok, r16 * (p8 / p16 - 1.0).abs(), zero).sum()
            sums[4] = torch.where(ok, r16, zero).sum()
        self._prob_sums = sums if self._prob_sums is None else self._prob_sums + sums

    def _pooled(self, gather: Gather | None) -> tuple[Samples, torch.Tensor]:
        """All observed rows (and prob-error sums) pooled over ranks; clears the buffer."""
        empty = {"dtype": torch.float64, "device": self._device}  # a rank may observe nothing
        rows = torch.cat(self._chunks) if self._chunks else torch.zeros(0, 4, **empty)
        sums = self._prob_sums if self._prob_sums is not None else torch.zeros(SUMS, **empty)
        self._chunks, self._prob_sums = [], None
        if gather is not None:
            rows = gather(rows)
            sums = gather(sums.to(rows.device).reshape(1, SUMS)).sum(0)
        rows, sums = rows.cpu(), sums.cpu()
        samples = samples_from_rows(rows, int(sums[2]))
        return samples, sums

    # ---- update ---------------------------------------------------------------------------
    def update(self, step: int, gather: Gather | None = None) -> dict[str, float]:
        """Finish step `step`: on calibration steps pool the statistics and move (L, H).

        The new bounds apply from step+1 on. Returns metrics (`calib_low`, `calib_high` always;
        on calibration steps also `calib_alpha`, `calib_rho_ref`, `calib_rho_fp8`, targets,
        counts, the uncertainty of L*, `calib_rho_best`, `calib_rho_fp8_next`, NMAEs and
        over-clip shares; names and meanings: `docs/architecture.md`). `gather` must be given on every data-parallel rank
        (it is a collective) or on none.
        """
        if not self.is_calibration_step(step):
            if self._chunks:
                raise RuntimeError(
                    f"Calibrator.update: statistics were observed on step {step}, which is not a "
                    f"calibration step; run the BF16 shadow passes only when is_calibration_step()"
                )
            return self._bounds_metrics()
        samples, sums = self._pooled(gather)
        metrics = self._statistics(samples, sums)
        metrics.update(self._move_bounds(samples, metrics, step))
        self.last_calibration_step = step
        self.history.append({"step": float(step), **metrics})
        return metrics

    def _bounds_metrics(self) -> dict[str, float]:
        """Bounds in force, and the update regime when known."""
        low, high = self.bounds
        out = {"calib_low": low, "calib_high": high}
        if self.updates_per_step is not None:
            out["updates_per_step"] = float(self.updates_per_step)
            out["calib_structurally_inactive"] = float(
                self.cfg.enabled and self.updates_per_step == 1
            )
        return out

    def _statistics(self, s: Samples, sums: torch.Tensor) -> dict[str, float]:
        """Diagnostics of the pooled calibration batch under the bounds in force and nominal."""
        (l0, h0), (low, high) = self.nominal, self.bounds
        neg = s.neg
        m: dict[str, float] = {
            "calib_n_neg": float(neg.sum()),
            "calib_n_pos": float(s.pos.sum()),
            "calib_dropped_nonfinite": float(s.num_dropped_nonfinite),
            "calib_bf16_lower_count_neg": float((s.bf16_ratio[neg] < l0).sum()),
            "calib_bf16_lower_frac_neg": lower_clip_fraction(s.bf16_ratio[neg], l0),
            "calib_fp8_lower_frac_neg": lower_clip_fraction(s.fp8_ratio[neg], low),
            "calib_fp8_nominal_lower_frac_neg": lower_clip_fraction(s.fp8_ratio[neg], l0),
        }
        mode = self.cfg.rho_mode
        m["calib_rho_ref"] = update_balance(s, s.bf16_ratio, l0, h0, self.dual_c, mode)[0]
        m["calib_rho_fp8"] = update_balance(s, s.fp8_ratio, low, high, self.dual_c, mode)[0]
        m["calib_rho_fp8_nominal"] = update_balance(s, s.fp8_ratio, l0, h0, self.dual_c, mode)[0]
        ratio_den = float(s.bf16_ratio.sum())
        m["ratio_nmae"] = (
            float((s.fp8_ratio - s.bf16_ratio).abs().sum()) / ratio_den
            if ratio_den > 0
            else math.nan
        )
        if float(sums[1]) > 0:
            m["prob_nmae"] = float(sums[0] / sums[1])
            m["ratio_amplification"] = (
                m["ratio_nmae"] / m["prob_nmae"] if m["prob_nmae"] > 0 else math.nan
            )
        if float(sums[4]) > 0:  # the θ pass's FP8 error alone, in the ratio's weighting
            m["single_pass_nmae"] = float(sums[3] / sums[4])
            m["ratio_compounding"] = (
                m["ratio_nmae"] / m["single_pass_nmae"] if m["single_pass_nmae"] > 0 else math.nan
            )
        m.update(overclip_stats(s.fp8_ratio, s.bf16_ratio, s.advantages, None, l0, h0, self.dual_c))
        return m

    def _move_bounds(self, s: Samples, stats: dict[str, float], step: int) -> dict[str, float]:
        """L* → applied L (damped EMA + rate limit), then H* at that L (see the class docstring)."""
        cfg, (l0, h0), (low, high) = self.cfg, self.nominal, self.bounds
        n_neg, n_pos = int(stats["calib_n_neg"]), int(stats["calib_n_pos"])
        out: dict[str, float] = {
            "calib_skipped": 0.0,
            "calib_cap_hit_low": 0.0,
            "calib_cap_hit_high": 0.0,
        }
        if n_neg < cfg.min_tokens or n_pos < cfg.min_tokens:
            out["calib_skipped"] = 1.0
            return {**out, **self._bounds_metrics()}
        neg = s.neg
        self.lower_pool.add(step, s.fp8_ratio[neg], s.bf16_ratio[neg])
        pooled = self.lower_pool.target(level=0.9)
        low_t = pooled.low_target
        out.update(
            calib_alpha=stats["calib_bf16_lower_count_neg"] / n_neg,
            calib_low_target=low_t,
            calib_low_weight=pooled.weight,
            calib_low_pool_clipped=float(pooled.clipped),
            calib_low_pool_windows=float(pooled.windows),
            calib_low_target_ci90_lo=pooled.interval.lo,
            calib_low_target_ci90_hi=pooled.interval.hi,
            calib_low_target_ci90_width=pooled.interval.hi - pooled.interval.lo,
        )
        beta_low = cfg.smoothing * out["calib_low_weight"]
        new_low = smooth_and_cap(low, low_t, beta_low, cfg.max_step_low, *self.low_limits())
        out["calib_cap_hit_low"] = float(abs(beta_low * (low_t - low)) > cfg.max_step_low)
        new_high = high
        if math.isfinite(stats["calib_rho_ref"]):
            h_floor, h_max = self.high_limits()
            target = upper_target(
                s, new_low, l0, h0, h_floor, h_max, self.dual_c, cfg.rho_mode, cfg.rho_tolerance
            )
            out.update(calib_high_target=target.high, calib_rho_best=target.rho_best)
            new_high = smooth_and_cap(
                high, target.high, cfg.smoothing, cfg.max_step_high, h_floor, h_max
            )
            out["calib_cap_hit_high"] = float(
                abs(cfg.smoothing * (target.high - high)) > cfg.max_step_high
            )
        else:
            out["calib_skipped_high"] = 1.0
        self._bounds = (new_low, new_high)
        out["calib_rho_fp8_next"] = update_balance(
            s, s.fp8_ratio, new_low, new_high, self.dual_c, cfg.rho_mode
        )[0]
        return {**out, **self._bounds_metrics()}

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state for checkpoints (bounds, last calibration step, history, pool)."""
        if self._chunks:
            raise RuntimeError("Calibrator.state_dict: call update() for the current step first")
        return {
            "version": _STATE_VERSION,
            "bounds": list(self.bounds),
            "nominal": list(self.nominal),
            "last_calibration_step": self.last_calibration_step,
            "history": [dict(h) for h in self.history],
            "lower_pool": self.lower_pool.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()`; refuses a checkpoint made with other nominal bounds."""
        if state.get("version") not in (1, _STATE_VERSION):
            raise ValueError(f"calibrator state: unsupported version {state.get('version')!r}")
        nominal = tuple(float(x) for x in state["nominal"])
        if any(abs(a - b) > 1e-12 for a, b in zip(nominal, self.nominal, strict=True)):
            raise ValueError(
                f"calibrator state was saved with nominal bounds {nominal} but this run has "
                f"{self.nominal}; resume with the same loss_fn.ratio_clip_min/max"
            )
        low, high = (float(x) for x in state["bounds"])
        if not 0.0 < low < 1.0 < high:
            raise ValueError(
                f"calibrator state: bounds must satisfy 0 < L < 1 < H, got {low}, {high}"
            )
        self._bounds = (low, high)
        self.last_calibration_step = state["last_calibration_step"]
        self.history = [dict(h) for h in state["history"]]
        self.lower_pool.load_state_dict(state.get("lower_pool", []))
