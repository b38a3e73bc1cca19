"""Clipped policy-gradient loss with NeMo RL's interface and calibrated (FP8) clip bounds.

`CalibratedClippedPGLoss(loss_cfg)` takes a recipe's `loss_fn` section (NeMo RL's
`ClippedPGLossConfig` keys plus the project's `calibration`) and is called exactly like NeMo RL's
`ClippedPGLossFn`: `loss_fn(next_token_logprobs=lp, data=data, global_valid_seqs=gs,
global_valid_toks=gt) -> (loss, metrics)`. Per token, with `r = exp(lp_cur − lp_prev)`:

    clip_loss = max(−A·r, −A·clamp(r, L, H))            (A < 0 and dual clip c: min(·, −A·c))
    loss      = Σ_M w·clip_loss / global_valid_toks     (token level; sequence level: mean of
                                                          per-sequence means / global_valid_seqs)
              + β·KL(π_θ ‖ π_ref) + μ·NLL(correct samples)

`w` is the off-policy weight `exp(lp_prev − lp_gen)` (optionally TIS-truncated, IcePop- or
sequence-masked). `(L, H)` come from the `Calibrator` when `calibration.enabled`, else
`(1 − ratio_clip_min, 1 + ratio_clip_max)`; with calibration off the loss and NeMo RL's metrics
equal `ClippedPGLossFn`'s. Metrics are per-micro-batch values normalised by the global counts, to
be summed by the caller (NeMo RL's rule); `derive_sign_fractions` turns the summed token shares
into the per-sign clip fractions logged as `train/clip_lower_frac_neg` etc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nemo_fp8_rl.calibration import Calibrator
from nemo_fp8_rl.calibration import diagnostics as diag
from nemo_fp8_rl.loss.config import LossInputType, LossType, MetricNormalizer, PGLossConfig

T = torch.Tensor
Data = Mapping[str, torch.Tensor]


def derive_sign_fractions(metrics: Mapping[str, float]) -> dict[str, float]:
    """From summed loss metrics, the per-sign clip fractions (`clip_lower_frac_neg`, …).

    `clip_lower_frac_neg = clip_lower_frac / neg_token_frac` (both are shares of all valid
    tokens, so their ratio is the share of negative-advantage tokens); likewise
    `clip_upper_frac_pos` and `clip_dual_frac_neg`. Missing parts give no entry.
    """
    out: dict[str, float] = {}
    pairs = {
        "clip_lower_frac_neg": ("clip_lower_frac", "neg_token_frac"),
        "clip_upper_frac_pos": ("clip_upper_frac", "pos_token_frac"),
        "clip_dual_frac_neg": ("clip_dual_frac", "neg_token_frac"),
        "neg_grad_drop_frac_neg": ("neg_grad_drop_frac", "neg_token_frac"),
    }
    for name, (num, den) in pairs.items():
        if num in metrics and den in metrics:
            out[name] = metrics[num] / metrics[den] if metrics[den] > 0 else 0.0
    return out


class CalibratedClippedPGLoss:
    """NeMo RL-compatible clipped PG loss whose clip bounds come from a `Calibrator`.

    Attributes read by NeMo RL: `input_type`, `loss_type`, `reference_policy_kl_penalty`,
    `use_fused_linear_logprobs`, `metric_normalizations`. `calibrator` is None when
    `calibration.enabled` is false.
    """

    input_type = LossInputType.LOGPROB

    def __init__(
        self, loss_cfg: Mapping[str, Any] | Any, use_fused_linear_logprobs: bool = False
    ) -> None:
        self.cfg = PGLossConfig.from_mapping(loss_cfg)
        self.use_fused_linear_logprobs = use_fused_linear_logprobs
        self.reference_policy_kl_penalty = (
            0.0 if self.cfg.use_kl_in_reward else self.cfg.reference_policy_kl_penalty
        )
        self.loss_type = (
            LossType.TOKEN_LEVEL if self.cfg.token_level_loss else LossType.SEQUENCE_LEVEL
        )
        self.calibrator: Calibrator | None = None
        if self.cfg.calibration.enabled:
            self.calibrator = Calibrator(
                self.cfg.calibration,
                self.cfg.ratio_clip_min,
                self.cfg.ratio_clip_max,
                self.cfg.ratio_clip_c,
            )
        self.metric_normalizations = self._normalizations()

    def _normalizations(self) -> dict[str, Any]:
        tok, seq, none = MetricNormalizer.TOKENS, MetricNormalizer.SEQUENCES, MetricNormalizer.NONE
        grad = tok if self.loss_type == LossType.TOKEN_LEVEL else seq
        norms = {
            "loss": grad,
            "kl_penalty": grad,
            "num_valid_samples": none,
            "positive_nll_loss": none,
        }
        for key in (
            "probs_ratio",
            "probs_ratio_clamped",
            "token_mult_prob_error",
            "gen_kl_error",
            "policy_kl_error",
            "js_divergence_error",
            "approx_entropy",
        ):
            norms[key] = tok
        for key in (
            "clip_lower_frac",
            "clip_upper_frac",
            "clip_dual_frac",
            "clip_frac",
            "neg_token_frac",
            "pos_token_frac",
            "calib_low",
            "calib_high",
            "neg_grad_drop_frac",
        ):
            norms[key] = tok
        for key in (
            "probs_ratio_min",
            "probs_ratio_max",
            "probs_ratio_clamped_min",
            "probs_ratio_clamped_max",
        ):
            norms[key] = none
        norms["sampling_importance_ratio"] = (
            seq if self.cfg.sequence_level_importance_ratios else tok
        )
        if self.cfg.truncated_importance_sampling_type is not None:
            norms["is_oob_ratio"] = (
                seq if self.cfg.truncated_importance_sampling_type == "seq-mask-tis" else tok
            )
        return norms

    @property
    def bounds(self) -> tuple[float, float]:
        """(L, H) applied by the next call: the calibrator's, or the nominal ones."""
        if self.calibrator is not None:
            return self.calibrator.bounds
        return 1.0 - self.cfg.ratio_clip_min, 1.0 + self.cfg.ratio_clip_max

    # ---- pieces ---------------------------------------------------------------------------
    def _ratios(
        self, curr: torch.Tensor, prev: torch.Tensor, token_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(r, clamp(r, L, H)); GSPO uses the per-sequence geometric mean ratio for every token."""
        cfg = self.cfg
        if cfg.force_on_policy_ratio:
            r = (curr - curr.detach()).exp()
            return r, r
        if cfg.disable_ppo_ratio:
            return curr, curr
        log_r = curr - prev
        if cfg.sequence_level_importance_ratios:
            r = (
                diag.masked_mean(log_r, token_mask, dim=-1)
                .unsqueeze(-1)
                .exp()
                .repeat(1, log_r.shape[1])
            )
        else:
            r = log_r.exp()
        low, high = self.bounds
        return r, r.clamp(low, high)

    def _clip_loss(
        self, adv: torch.Tensor, r: torch.Tensor, r_clamped: torch.Tensor, curr: torch.Tensor
    ) -> torch.Tensor:
        """Pessimistic PPO term per token (CISPO: `−A·sg(clamp(r))·lp`), then the dual clip."""
        if self.cfg.use_cispo:
            loss = -adv * r_clamped.detach() * curr
        else:
            loss = torch.max(-adv * r, -adv * r_clamped)
        if self.cfg.ratio_clip_c is not None:
            loss = torch.where(adv < 0, torch.min(loss, -adv * self.cfg.ratio_clip_c), loss)
        return loss

    def _is_weights(
        self, prev: T, gen: T, mask: T, token_mask: T, sample_mask: T, gs: T, gt: T
    ) -> tuple[T, dict[str, float]]:
        """Off-policy weights `exp(lp_prev − lp_gen)` (per token, or per sequence for GSPO), NaN/inf → 0,
        then TIS truncation / IcePop masking / sequence masking; returns (weights, is_oob metric)."""
        cfg = self.cfg
        if cfg.sequence_level_importance_ratios:
            w = ((prev - gen) * mask).sum(-1).exp().detach().unsqueeze(-1)
        else:
            w = (prev - gen).exp()
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
        kind, hi, lo = (
            cfg.truncated_importance_sampling_type,
            cfg.truncated_importance_sampling_ratio,
            cfg.truncated_importance_sampling_ratio_min,
        )
        if hi is None or kind is None:
            return w, {}
        if kind == "tis":
            lo = 0.0 if lo is None else lo
            oob = diag.masked_mean(((w > hi) | (w < lo)).float(), mask, gt)
            return w.clamp(lo, hi), {"is_oob_ratio": float(oob)}
        if kind == "icepop":
            keep = (w >= lo) & (w <= hi)
            oob = diag.masked_mean((~keep).float(), mask, gt)
            return torch.where(keep, w, torch.zeros_like(w)), {"is_oob_ratio": float(oob)}
        log_w = torch.nan_to_num(prev - gen, nan=0.0, posinf=0.0, neginf=0.0)
        geo = diag.masked_mean(log_w, token_mask, dim=-1).exp().detach()
        keep = ((geo >= lo) & (geo <= hi)).float()
        oob = diag.masked_mean(1.0 - keep, sample_mask, gs)
        return w * keep.unsqueeze(-1), {"is_oob_ratio": float(oob)}

    def _reduce(self, values: T, mask: T, token_mask: T, sample_mask: T, gs: T, gt: T) -> T:
        """Token level: `Σ_M v / gt`; sequence level: `Σ_i s_i·mean_t v / gs`."""
        if self.loss_type == LossType.TOKEN_LEVEL:
            return diag.masked_mean(values, mask, gt)
        return diag.masked_mean(diag.masked_mean(values, token_mask, dim=-1), sample_mask, gs)

    def _kl(
        self, data: Data, curr: T, gen: T, mask: T, token_mask: T, sample_mask: T, gs: T, gt: T
    ) -> T:
        """`β · KL_type(π_θ ‖ π_ref)` with input/output clamps, weighted by `exp(lp − sg(lp))`
        (value 1, keeps the score-function gradient) or by `exp(lp − lp_gen)` on-policy."""
        beta = self.reference_policy_kl_penalty
        if beta == 0:
            return torch.tensor(0.0)
        ref = data["reference_policy_logprobs"][:, 1:]
        lp = data.get("curr_logprobs_unfiltered", curr) if hasattr(data, "get") else curr
        w = (
            (lp - gen).exp()
            if self.cfg.use_on_policy_kl_approximation
            else (lp - lp.detach()).exp()
        )
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
        kl = beta * diag.kl_estimate(
            lp,
            ref,
            self.cfg.reference_policy_kl_type,
            self.cfg.kl_input_clamp_value,
            self.cfg.kl_output_clamp_value,
            w,
        )
        return self._reduce(kl, mask, token_mask, sample_mask, gs, gt)

    def _nll(self, data: Data, curr: T, mask: T) -> T:
        """VAPO positive-example NLL: mean of −lp over tokens of samples with reward > 0 (local mean)."""
        if self.cfg.positive_example_nll_weight <= 0 or "rewards" not in data:
            return torch.tensor(0.0, device=mask.device)
        correct = mask * (data["rewards"] > 0).float().unsqueeze(-1)
        n = correct.sum()
        return (
            diag.masked_mean(-curr, correct, n) if n > 0 else torch.tensor(0.0, device=mask.device)
        )

    # ---- call -----------------------------------------------------------------------------
    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics for one micro-batch; `next_token_logprobs` is [B, S-1], data is [B, S]."""
        curr, gs, gt = next_token_logprobs, global_valid_seqs, global_valid_toks
        token_mask, sample_mask = data["token_mask"][:, 1:], data["sample_mask"]
        adv, gen = data["advantages"][:, 1:], data["generation_logprobs"][:, 1:]
        prev = curr.detach() if self.cfg.force_on_policy_ratio else data["prev_logprobs"][:, 1:]
        mask = token_mask * sample_mask.unsqueeze(-1)
        metrics = self._mismatch_metrics(gen, prev, mask, gt)
        kl = self._kl(data, curr, gen, mask, token_mask, sample_mask, gs, gt)
        r, r_clamped = self._ratios(curr, prev, token_mask)
        clip_loss = self._clip_loss(adv, r, r_clamped, curr)
        clip_loss, dropped = self._drop_negative_gradients(clip_loss, adv, mask)
        is_w, is_metrics = self._is_weights(prev, gen, mask, token_mask, sample_mask, gs, gt)
        use_w = is_w if self.cfg.use_importance_sampling_correction else torch.ones_like(prev)
        actor = self._reduce(use_w * clip_loss, mask, token_mask, sample_mask, gs, gt)
        nll = self._nll(data, curr, mask)
        loss = actor + kl + self.cfg.positive_example_nll_weight * nll
        with torch.no_grad():
            if self.cfg.sequence_level_importance_ratios:
                sir = diag.masked_mean(is_w, sample_mask, gs)
            else:
                sir = diag.masked_mean(is_w, mask, gt)
            metrics.update(
                loss=loss.item(),
                kl_penalty=kl.item() / self.reference_policy_kl_penalty if bool(kl) else 0,
                sampling_importance_ratio=sir.item(),
                num_valid_samples=sample_mask.sum().item(),
                approx_entropy=(-diag.masked_mean((curr - gen).exp() * curr, mask, gt)).item(),
                **is_metrics,
                positive_nll_loss=nll.item(),
            )
            metrics.update(self._ratio_metrics(r.detach(), r_clamped.detach(), mask, gt))
            metrics.update(self._clip_metrics(r.detach(), adv, mask, gt))
            if dropped is not None:
                metrics["neg_grad_drop_frac"] = diag.masked_mean(dropped.float(), mask, gt).item()
            self._observe(data, curr.detach(), prev, adv, mask, use_w, token_mask)
        return loss, metrics

    def _drop_negative_gradients(self, clip_loss: T, adv: T, mask: T) -> tuple[T, T | None]:
        """The negative-gradient drop ablation (`loss_fn.ablation`): a random share q of the
        valid A<0 tokens keep their loss value but, detached, get the lower clip's zero
        gradient. Returns the loss terms and the dropped-token mask (None when q = 0)."""
        q = self.cfg.ablation.negative_gradient_drop_q
        if q <= 0.0:
            return clip_loss, None
        dropped = (adv < 0) & mask.bool() & (torch.rand(adv.shape, device=adv.device) < q)
        return torch.where(dropped, clip_loss.detach(), clip_loss), dropped

    def _mismatch_metrics(self, gen: T, prev: T, mask: T, gt: T) -> dict[str, float]:
        """NeMo RL's train-vs-generation metrics (token means over the global count)."""
        kl_type = self.cfg.reference_policy_kl_type
        return {
            "token_mult_prob_error": diag.token_mult_prob_error(gen, prev, mask, gt),
            "gen_kl_error": diag.gen_kl_error(gen, prev, mask, gt, kl_type),
            "policy_kl_error": diag.policy_kl_error(gen, prev, mask, gt, kl_type),
            "js_divergence_error": diag.js_divergence_error(gen, prev, mask, gt),
        }

    @staticmethod
    def _ratio_metrics(r: T, r_clamped: T, mask: T, gt: T) -> dict[str, float]:
        """Mean ratio (÷ global tokens) and extremes over valid tokens (±inf when there are none)."""
        valid = mask.bool()

        def extreme(x: torch.Tensor, fn, fill: float) -> float:
            return fn(torch.where(valid, x, torch.full_like(x, fill))).item()

        inf = float("inf")
        return {
            "probs_ratio": diag.masked_mean(r, mask, gt).item(),
            "probs_ratio_clamped": diag.masked_mean(r_clamped, mask, gt).item(),
            "probs_ratio_min": extreme(r, torch.min, inf),
            "probs_ratio_max": extreme(r, torch.max, -inf),
            "probs_ratio_clamped_min": extreme(r_clamped, torch.min, inf),
            "probs_ratio_clamped_max": extreme(r_clamped, torch.max, -inf),
        }

    def _clip_metrics(self, r: T, adv: T, mask: T, gt: T) -> dict[str, float]:
        """Token shares (÷ global valid tokens, summable) of clipped tokens by cause and of each sign."""
        if self.cfg.disable_ppo_ratio or self.cfg.use_cispo:
            return {}
        low, high = self.bounds
        masks = diag.clip_masks(r, adv, low, high, self.cfg.ratio_clip_c)

        def share(x: torch.Tensor) -> float:
            return diag.masked_mean(x.float(), mask, gt).item()

        local_share = float(mask.sum()) / (float(gt) + 1e-8)  # sums to 1 over the micro-batches
        return {
            "clip_lower_frac": share(masks["lower"]),
            "clip_upper_frac": share(masks["upper"]),
            "clip_dual_frac": share(masks["dual"]),
            "clip_frac": share(masks["any"]),
            "neg_token_frac": share(adv < 0),
            "pos_token_frac": share(adv > 0),
            "calib_low": low * local_share,
            "calib_high": high * local_share,
        }

    def _observe(
        self, data: Data, curr: T, prev: T, adv: T, mask: T, is_w: T, token_mask: T
    ) -> None:
        """On calibration steps (shadow BF16 keys present) feed this micro-batch to the calibrator."""
        has = [k in data for k in ("bf16_prev_logprobs", "bf16_curr_logprobs")]
        if self.calibrator is None or not any(has):
            return
        if not all(has):
            raise KeyError(
                "calibration: data must hold both bf16_prev_logprobs and bf16_curr_logprobs, or neither"
            )
        bf16_curr = data["bf16_curr_logprobs"]
        bf16_prev = data["bf16_prev_logprobs"][:, 1:]
        agg = torch.ones_like(mask)
        if self.loss_type == LossType.SEQUENCE_LEVEL:
            agg = agg / token_mask.sum(-1, keepdim=True).clamp(min=1)
        self.calibrator.observe(
            fp8_ratio=(curr - prev).exp(),
            bf16_ratio=(bf16_curr - bf16_prev).exp(),
            advantages=adv,
            weights=agg * is_w.expand_as(mask),
            mask=mask,
            fp8_logprobs=curr,
            bf16_logprobs=bf16_curr,
        )
