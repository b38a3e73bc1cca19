"""The trainer: FP32 master weights (BF16-rounded compute), FP8 training emulation, the
project's clipped PG loss with its calibrator, BF16 shadow passes on calibration steps.

One GRPO step on a rollout batch of `N` samples:
1. `prev_logprobs` = FP8 forward of θ_old over the batch (and the entropy metric);
   on shadow steps also `bf16_prev_logprobs` with FP8 off;
2. `N / train_global_batch_size` optimiser steps; each sums `train_global_batch_size /
   train_micro_batch_size` micro-batch losses (globally normalised, NeMo RL's rule), clips the
   gradient norm to `policy.max_grad_norm`, and takes an AdamW step (FP32 state);
   on shadow steps each micro-batch also gets a no-grad BF16 forward (`bf16_curr_logprobs`);
3. `calibrator.update(step)` (bounds for the next steps) and the shadow diagnostics.
Loss metrics are summed over the micro-batches of an optimiser step, then averaged over the
optimiser steps of the GRPO step.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from typing import Any

import torch

from nemo_fp8_rl.calibration import diagnostics as diag
from nemo_fp8_rl.engines.local import bf16_scoring, precision
from nemo_fp8_rl.engines.local.batch import select
from nemo_fp8_rl.loss import CalibratedClippedPGLoss, derive_sign_fractions
from nemo_fp8_rl.refit import RefitPlan, stream_refit
from nemo_fp8_rl.tiny.model import (
    load_weights,
    policy_from_config,
    quiet_transformers,
    token_logprobs,
)

_EXTREMES = {"probs_ratio_min": min, "probs_ratio_clamped_min": min}
_EXTREMES |= {"probs_ratio_max": max, "probs_ratio_clamped_max": max}


class Trainer:
    """Policy trainer (a Ray actor in the embedded engine; a plain object in tests)."""

    def __init__(
        self, config: dict[str, Any], model_dir: str | None = None, num_threads: int = 1
    ) -> None:
        """Set up the policy (from `model_dir`, or built from the recipe until `load_policy`),
        its precision, the optimiser and the loss."""
        torch.set_num_threads(num_threads)
        quiet_transformers()
        policy = config["policy"]
        self.model, _ = policy_from_config(config, model_dir)
        self.reference = None
        self.use_reference = config["loss_fn"]["reference_policy_kl_penalty"] > 0
        self._snapshot_reference()
        self.precision = precision.TrainingPrecision.from_config(config)
        self.precision.apply(self.model)
        opt = policy["megatron_cfg"]["optimizer"]
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt["lr"],
            betas=(opt["adam_beta1"], opt["adam_beta2"]),
            eps=opt["adam_eps"],
            weight_decay=opt["weight_decay"],
        )
        self.loss_fn = CalibratedClippedPGLoss(config["loss_fn"])
        self.config = config
        self.plan: RefitPlan | None = None
        self.bf16_plan: RefitPlan | None = None
        self.gbs = policy["train_global_batch_size"]
        self.mbs = policy["train_micro_batch_size"]
        self.logprob_bs = policy.get("logprob_batch_size") or self.gbs
        self.max_grad_norm = policy["max_grad_norm"]
        self.temperature = policy["generation"]["temperature"] or 1.0
        cal = config["loss_fn"]["calibration"]
        self.shadow_interval, self.shadow_start = cal["interval"], cal["start_step"]
        n = config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"]
        if self.loss_fn.calibrator is not None:
            self.loss_fn.calibrator.set_updates_per_step(n // self.gbs)

    def _snapshot_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference policy (when KL is on)."""
        if self.use_reference:
            self.reference = copy.deepcopy(self.model).requires_grad_(False)

    def load_policy(self, model_dir: str) -> None:
        """Load the initial policy's weights (the warm-started HF checkpoint) in place."""
        load_weights(self.model, model_dir)
        self._snapshot_reference()

    # ---- precision passes ----------------------------------------------------------------
    def is_shadow_step(self, step: int) -> bool:
        """BF16 shadow passes run on the calibration schedule, and only when training is FP8.

        With calibration on this is exactly `calibrator.is_calibration_step(step)`; with it off
        the same schedule still yields the FP8-vs-BF16 diagnostics (nothing feeds the bounds).
        """
        if self.loss_fn.calibrator is not None:
            return self.loss_fn.calibrator.is_calibration_step(step)
        if not self.precision.quantized:
            return False
        return step >= self.shadow_start and (step - self.shadow_start) % self.shadow_interval == 0

    @torch.no_grad()
    def _score(self, batch: dict[str, torch.Tensor], model=None, entropy: bool = False):
        """Per-token log-probs `[N, S]` (0 at position 0) of `model` over the batch, chunked."""
        model = self.model if model is None else model
        lps, ents = [], []
        for start in range(0, batch["input_ids"].shape[0], self.logprob_bs):
            rows = select(batch, slice(start, start + self.logprob_bs))
            lp, ent = token_logprobs(
                model, rows["input_ids"], rows["attention_mask"], self.temperature, entropy
            )
            lps.append(torch.nn.functional.pad(lp, (1, 0)))
            ents.append(ent)
        lp = torch.cat(lps)
        return (lp, torch.cat(ents)) if entropy else (lp, None)

    # ---- one GRPO step -------------------------------------------------------------------
    def train_step(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, float]:
        """Run step `step` on a rollout batch; return `train/...` and `timing/...` metrics."""
        timing: dict[str, float] = defaultdict(float)
        shadow = self.is_shadow_step(step)
        t0 = time.perf_counter()
        batch = dict(batch)
        batch["prev_logprobs"], ent = self._score(batch, entropy=True)
        mask = batch["token_mask"][:, 1:]
        metrics = {"entropy": float(diag.masked_mean(ent, mask))}
        # each response's entropy quartile in this batch, for the clipping-by-entropy split
        batch["entropy_quantile"] = diag.response_entropy_quantile(
            ent, mask * batch["sample_mask"][:, None]
        )
        self._clip_rows: list[dict[str, torch.Tensor]] = []
        low_in_force = self.loss_fn.bounds[0]
        if self.reference is not None:
            batch["reference_policy_logprobs"], _ = self._score(batch, self.reference)
        timing["logprobs"] = time.perf_counter() - t0
        if shadow:
            t1 = time.perf_counter()
            with self.precision.shadow(self.model):
                batch["bf16_prev_logprobs"], _ = self._score(batch)
            timing["shadow"] += time.perf_counter() - t1
        t2, shadow_before = time.perf_counter(), timing["shadow"]
        steps, shadow_rows = self._optimise(batch, shadow, timing)
        in_loop_shadow = timing["shadow"] - shadow_before
        timing["policy_training"] = time.perf_counter() - t2 - in_loop_shadow
        metrics.update(steps)
        metrics.update(_clip_entropy_split(self._clip_rows, low_in_force))
        metrics.update(self._finish_calibration(step, shadow_rows))
        if self.precision.kv_fp8:
            with self.precision.kv_calibration(self.model):
                self._score(batch)
        out = {f"train/{k}": v for k, v in metrics.items()}
        out.update({f"timing/train/{k}": v for k, v in timing.items()})
        out["timing/train/shadow"] = timing.get("shadow", 0.0)
        return out

    def _optimise(self, batch, shadow: bool, timing) -> tuple[dict[str, float], list]:
        """All optimiser steps of one GRPO step; returns averaged metrics and shadow rows."""
        n = batch["input_ids"].shape[0]
        if n % self.gbs or self.gbs % self.mbs:
            raise ValueError(
                f"rollout batch {n} must be a multiple of policy.train_global_batch_size "
                f"{self.gbs}, itself a multiple of policy.train_micro_batch_size {self.mbs}"
            )
        per_step: list[dict[str, float]] = []
        shadow_rows: list = []
        for start in range(0, n, self.gbs):
            mini = select(batch, slice(start, start + self.gbs))
            per_step.append(self._optimiser_step(mini, shadow, timing, shadow_rows))
        merged = _average(per_step)
        merged["updates_per_step"] = float(len(per_step))
        return merged, shadow_rows

    def _optimiser_step(self, mini, shadow: bool, timing, shadow_rows: list) -> dict[str, float]:
        """Accumulate the micro-batch losses of one mini-batch, clip, and step AdamW."""
        mask = mini["token_mask"][:, 1:] * mini["sample_mask"][:, None]
        gt, gs = mask.sum(), mini["sample_mask"].sum()
        sums: dict[str, float] = defaultdict(float)
        extremes: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, mini["input_ids"].shape[0], self.mbs):
            micro = select(mini, slice(start, start + self.mbs))
            lp, _ = token_logprobs(
                self.model, micro["input_ids"], micro["attention_mask"], self.temperature
            )
            if shadow:
                t = time.perf_counter()
                with torch.no_grad(), self.precision.shadow(self.model):
                    micro["bf16_curr_logprobs"], _ = token_logprobs(
                        self.model, micro["input_ids"], micro["attention_mask"], self.temperature
                    )
                timing["shadow"] += time.perf_counter() - t
                shadow_rows.append(_shadow_row(micro, lp.detach()))
            self._clip_rows.append(_clip_row(micro, lp.detach()))
            loss, m = self.loss_fn(
                next_token_logprobs=lp, data=micro, global_valid_seqs=gs, global_valid_toks=gt
            )
            loss.backward()
            for k, v in m.items():
                if k in _EXTREMES:
                    extremes[k] = _EXTREMES[k](extremes.get(k, v), v)
                else:
                    sums[k] += float(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        out = {**sums, **extremes, **derive_sign_fractions(sums)}
        out["grad_norm"] = float(grad_norm)
        return out

    def _finish_calibration(self, step: int, shadow_rows: list) -> dict[str, float]:
        """Calibrator update (new bounds from step+1 on) and the shadow-pass diagnostics."""
        out: dict[str, float] = {}
        if shadow_rows:
            cfg = self.loss_fn.cfg
            nominal = (1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
            out.update(shadow_metrics(shadow_rows, nominal, cfg.ratio_clip_c))
        if self.loss_fn.calibrator is not None:
            cal = self.loss_fn.calibrator.update(step)
            # its own NMAEs duplicate the shadow metrics above: only its `calib_*` keys are kept.
            # `calib_low/high` stay the bounds in force this step (from the loss); the bounds
            # the update sets for the next steps are logged as `calib_low/high_next`.
            for k, v in cal.items():
                if k in ("calib_low", "calib_high"):
                    out[f"{k}_next"] = v
                elif k.startswith("calib_"):
                    out[k] = v
        return out

    # ---- refit and checkpoints -----------------------------------------------------------
    def refit_buckets(self) -> tuple[list, list[tuple[float, float]]]:
        """The refit: BF16 masters through the bridge (FP8 per the recipe) and K/V scales.

        Buckets are built here, on the sender side, and travel to the rollout engine as one
        Ray object; the K/V scales are those calibrated on the last step's batch.
        """
        named = precision.export_weights(self.model)
        if self.plan is None:
            self.plan = RefitPlan.from_config(
                self.config,
                [n for n, _ in named],
                target="module",
                scheme=precision.refit_scheme(self.config),
            )
        bucket_bytes = self.config["refit"]["bucket_size_mb"] * 2**20
        buckets = list(stream_refit(named, self.plan, bucket_bytes=bucket_bytes))
        return buckets, precision.kv_scales(self.model)

    def bf16_refit_buckets(self) -> tuple[list, list[tuple[float, float]]]:
        """The masters as a BF16 refit (no FP8, no K/V scales), for BF16-generation scoring."""
        named = precision.export_weights(self.model)
        if self.bf16_plan is None:
            config = bf16_scoring.bf16_generation_config(self.config)
            self.bf16_plan = RefitPlan.from_config(config, [n for n, _ in named], target="module")
        bucket_bytes = self.config["refit"]["bucket_size_mb"] * 2**20
        return list(stream_refit(named, self.bf16_plan, bucket_bytes=bucket_bytes)), []

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: masters, optimiser, calibrator, RNG."""
        cal = self.loss_fn.calibrator
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "calibrator": cal.state_dict() if cal is not None else None,
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.loss_fn.calibrator is not None and state["calibrator"] is not None:
            self.loss_fn.calibrator.load_state_dict(state["calibrator"])
        torch.set_rng_state(state["rng"])

    def ping(self) -> bool:
        """Liveness check for the driver."""
        return True


def _average(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Mean over optimiser steps (min / max for the extreme-value metrics)."""
    keys = {k for d in per_step for k in d}
    out = {}
    for k in keys:
        vals = [d[k] for d in per_step if k in d]
        out[k] = _EXTREMES[k](vals) if k in _EXTREMES else sum(vals) / len(vals)
    return out


def _shadow_row(micro: dict[str, torch.Tensor], fp8_curr: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the shadow diagnostics need from one micro-batch (all `[B, S-1]`)."""
    return {
        "fp8_curr": fp8_curr,
        "bf16_curr": micro["bf16_curr_logprobs"],
        "fp8_prev": micro["prev_logprobs"][:, 1:],
        "bf16_prev": micro["bf16_prev_logprobs"][:, 1:],
        "adv": micro["advantages"][:, 1:],
        "mask": micro["token_mask"][:, 1:] * micro["sample_mask"][:, None],
        "quantile": micro["entropy_quantile"][:, None].expand_as(fp8_curr),
    }


def _clip_row(micro: dict[str, torch.Tensor], curr: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token ratio r = exp(lp_θ - lp_θold), advantages, mask and entropy quartile (`[B, S-1]`)."""
    return {
        "ratio": (curr - micro["prev_logprobs"][:, 1:]).exp(),
        "adv": micro["advantages"][:, 1:],
        "mask": micro["token_mask"][:, 1:] * micro["sample_mask"][:, None],
        "quantile": micro["entropy_quantile"][:, None].expand_as(curr),
    }


def _clip_entropy_split(rows: list[dict[str, torch.Tensor]], low: float) -> dict[str, float]:
    """`clip_lower_share_entropy_q1..4` pooled over a step's micro-batches and optimiser steps
    (`diagnostics.lower_clip_entropy_split`; each token carries its response's quartile)."""
    if not rows:
        return {}
    cat = {k: torch.cat([r[k].reshape(-1) for r in rows]) for k in rows[0]}
    return diag.lower_clip_entropy_split(
        cat["ratio"], cat["adv"], cat["mask"], cat["quantile"], low
    )


def shadow_metrics(
    rows: list[dict], nominal: tuple[float, float], dual_c: float | None
) -> dict[str, float]:
    """FP8-vs-BF16 diagnostics pooled over a step's micro-batches (calibrated-clipping.md §5).

    With `p̃ = exp(lp8)`, `p = exp(lp16)` at the current weights, `r̃ = exp(lp8 − lp8_old)`,
    `r = exp(lp16 − lp16_old)`, over valid response tokens M:
    `prob_nmae = Σ|p̃ − p| / Σp`, `ratio_nmae = Σ|r̃ − r| / Σr`,
    `ratio_amplification = ratio_nmae / prob_nmae` (the paper-style quotient: ≈ 2 even for one
    FP8 pass, as its two sides weigh tokens differently); `single_pass_nmae`, the ratio error one
    FP8 pass causes alone, weighted like `ratio_nmae` (`diagnostics.single_pass_nmae`), and
    `ratio_compounding = ratio_nmae / single_pass_nmae`, the measure of compounding: √2 ≈ 1.41
    for independent errors of the two passes, 0 when they cancel; the per-token variant `prob_relative_error = mean |p̃/p − 1|`
    and `prob_relative_error_over_nmae = prob_relative_error / prob_nmae`, a ratio of two
    probability-error measures with no importance ratio in it (it shows how much more the
    error weighs on low-probability tokens; tiny-model.md §6 calls it "amplification");
    `bf16_lower_frac_neg` and
    `fp8_nominal_lower_frac_neg`: shares of negative-advantage tokens below the nominal lower
    bound in each precision; the over-clip decomposition at the nominal bounds; and where the
    over-clipped A<0 tokens sit by response-entropy quartile (`overclip_share_entropy_q1..4`).
    """
    cat = {k: torch.cat([r[k].reshape(-1) for r in rows]) for k in rows[0]}
    r8 = (cat["fp8_curr"] - cat["fp8_prev"]).exp()
    r16 = (cat["bf16_curr"] - cat["bf16_prev"]).exp()
    m, adv = cat["mask"], cat["adv"]
    neg = (m > 0) & (adv < 0)
    n_neg = max(int(neg.sum()), 1)
    out = {
        "prob_nmae": diag.prob_nmae(cat["fp8_curr"], cat["bf16_curr"], m),
        "ratio_nmae": diag.ratio_nmae(r8, r16, m),
        "single_pass_nmae": diag.single_pass_nmae(
            cat["fp8_curr"], cat["bf16_curr"], cat["fp8_prev"], cat["bf16_prev"], m
        ),
        "prob_relative_error": diag.prob_relative_error(cat["fp8_curr"], cat["bf16_curr"], m),
        "bf16_lower_frac_neg": float((neg & (r16 < nominal[0])).sum()) / n_neg,
        "fp8_nominal_lower_frac_neg": float((neg & (r8 < nominal[0])).sum()) / n_neg,
    }
    nmae = out["prob_nmae"]
    out["ratio_amplification"] = out["ratio_nmae"] / nmae if nmae > 0 else math.nan
    single = out["single_pass_nmae"]
    out["ratio_compounding"] = out["ratio_nmae"] / single if single > 0 else math.nan
    out["prob_relative_error_over_nmae"] = (
        out["prob_relative_error"] / nmae if nmae > 0 else math.nan
    )
    out.update(diag.overclip_stats(r8, r16, adv, m, nominal[0], nominal[1], dual_c))
    if "quantile" in cat:  # each token carries its response's entropy quartile
        out.update(diag.overclip_entropy_split(r8, r16, adv, m, cat["quantile"], nominal[0]))
    return out
