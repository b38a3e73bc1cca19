"""FP8-vs-BF16 and train-vs-generation diagnostics, clip fractions by sign.

Entropy surges over a logged series: `nemo_fp8_rl.analysis.surge`.

Functions over tensors; the loss and the calibrator call them, engines may call them offline.
Masked means follow NeMo RL's rule `Σ(v·m) / (normalizer + 1e-8)`, where `normalizer` is the
global valid-token count (per-micro-batch values then *sum* to the global mean) or, when None,
the local mask sum. Formulas: reference page `calibrated-clipping.md` §5.
"""

from __future__ import annotations

import math

import torch

_EPS = 1e-8
Tensor = torch.Tensor
Normalizer = torch.Tensor | float | None


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    normalizer: Normalizer = None,
    dim: int | None = None,
) -> torch.Tensor:
    """`Σ(values·mask) / (normalizer + 1e-8)`; normalizer defaults to `Σ mask` (NeMo RL's rule)."""
    den = mask.sum(dim=dim) if normalizer is None else normalizer
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    return total / (den + _EPS)


def kl_estimate(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    input_clamp: float | None = None,
    output_clamp: float | None = None,
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from sampled log-probs (Schulman's k1/k2/k3).

    With `x = logprobs_reference − logprobs` (clamped to ±input_clamp): k1 = −x, k2 = x²/2,
    k3 = eˣ − 1 − x. Optional weights multiply the estimate (detached where the input clamp is
    active) before the output clamp.
    """
    x = logprobs_reference - logprobs
    if input_clamp is not None:
        clamped = x.clamp(-input_clamp, input_clamp)
        if importance_weights is not None:
            importance_weights = torch.where(
                x == clamped, importance_weights, importance_weights.detach()
            )
        x = clamped
    if kl_type == "k1":
        kl = -x
    elif kl_type == "k2":
        kl = x.square() / 2
    elif kl_type == "k3":
        kl = x.exp() - 1 - x
    else:
        raise ValueError(f"reference_policy_kl_type must be 'k1', 'k2' or 'k3', got {kl_type!r}")
    if importance_weights is not None:
        kl = importance_weights * kl
    return kl if output_clamp is None else kl.clamp(-output_clamp, output_clamp)


# ---- train vs generation mismatch (NeMo RL names) ---------------------------------------------
def token_mult_prob_error(
    gen_lp: torch.Tensor, prev_lp: torch.Tensor, mask: torch.Tensor, normalizer: Normalizer = None
) -> float:
    """`mean_M exp(|lp_gen − lp_prev|)`; 1.0 is a perfect match (NeMo RL: investigate > 1.03-1.05)."""
    return float(masked_mean(torch.exp((gen_lp - prev_lp).abs() * mask), mask, normalizer))


def gen_kl_error(
    gen_lp: torch.Tensor,
    prev_lp: torch.Tensor,
    mask: torch.Tensor,
    normalizer: Normalizer = None,
    kl_type: str = "k3",
) -> float:
    """KL(P_gen ‖ P_train) estimated on generated tokens: k3 of `lp_prev − lp_gen` (good: < 1e-3)."""
    return float(masked_mean(kl_estimate(gen_lp, prev_lp, kl_type), mask, normalizer))


def policy_kl_error(
    gen_lp: torch.Tensor,
    prev_lp: torch.Tensor,
    mask: torch.Tensor,
    normalizer: Normalizer = None,
    kl_type: str = "k3",
) -> float:
    """KL(P_train ‖ P_gen) estimate: k3 of `lp_gen − lp_prev`."""
    return float(masked_mean(kl_estimate(prev_lp, gen_lp, kl_type), mask, normalizer))


def js_divergence_error(
    gen_lp: torch.Tensor, prev_lp: torch.Tensor, mask: torch.Tensor, normalizer: Normalizer = None
) -> float:
    """Per-token JSD estimate: ½k3(P_train ‖ M) + ½k3(P_gen ‖ M), `M = ½(p_train + p_gen)`."""
    log_mix = torch.log(0.5 * prev_lp.exp() + 0.5 * gen_lp.exp())
    d_prev, d_gen = prev_lp - log_mix, gen_lp - log_mix
    jsd = 0.5 * (d_prev.exp() - d_prev - 1) + 0.5 * (d_gen.exp() - d_gen - 1)
    return float(masked_mean(jsd, mask, normalizer))


# ---- FP8 vs BF16 shadow pass ------------------------------------------------------------------
def prob_nmae(fp8_lp: torch.Tensor, bf16_lp: torch.Tensor, mask: torch.Tensor) -> float:
    """Probability NMAE `Σ_M |p̃ − p| / Σ_M p`, `p = exp(lp_BF16)`, `p̃ = exp(lp_FP8)` (paper: < 3 %)."""
    p8, p16, m = fp8_lp.double().exp(), bf16_lp.double().exp(), mask.double()
    return float(((p8 - p16).abs() * m).sum() / (p16 * m).sum())


def prob_relative_error(fp8_lp: torch.Tensor, bf16_lp: torch.Tensor, mask: torch.Tensor) -> float:
    """Per-token relative variant `mean_M |p̃ − p| / p = mean_M |exp(lp̃ − lp) − 1|`."""
    rel = ((fp8_lp.double() - bf16_lp.double()).exp() - 1).abs()
    return float(masked_mean(rel, mask.double()))


def ratio_nmae(fp8_ratio: torch.Tensor, bf16_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """Ratio NMAE `Σ_M |r̃ − r| / Σ_M r`."""
    m = mask.double()
    return float(
        ((fp8_ratio.double() - bf16_ratio.double()).abs() * m).sum()
        / (bf16_ratio.double() * m).sum()
    )


def single_pass_nmae(
    fp8_curr: Tensor, bf16_curr: Tensor, fp8_prev: Tensor, bf16_prev: Tensor, mask: Tensor
) -> float:
    """Ratio error of one FP8 pass alone, weighted like `ratio_nmae` (the compounding baseline).

    With r = exp(lp_θ − lp_θold) in BF16 and e = lp̃ − lp the FP8 error of a pass: FP8 in the θ
    pass only gives r·exp(e_θ), in the θ_old pass only r·exp(−e_θold). The result is the mean
    of `Σ_M r·|exp(e_θ) − 1| / Σ_M r` and `Σ_M r·|exp(−e_θold) − 1| / Σ_M r`.
    """
    r = (bf16_curr.double() - bf16_prev.double()).exp()
    only_curr = (fp8_curr.double() - bf16_prev.double()).exp()
    only_prev = (bf16_curr.double() - fp8_prev.double()).exp()
    return 0.5 * (ratio_nmae(only_curr, r, mask) + ratio_nmae(only_prev, r, mask))


def ratio_amplification(
    fp8_ratio: Tensor, bf16_ratio: Tensor, fp8_lp: Tensor, bf16_lp: Tensor, mask: Tensor
) -> float:
    """`NMAE_r / NMAE_p` (paper: 1.7-2.9x; ≈ √2 if the two passes' errors were independent)."""
    return ratio_nmae(fp8_ratio, bf16_ratio, mask) / prob_nmae(fp8_lp, bf16_lp, mask)


# ---- clipping ---------------------------------------------------------------------------------
def clip_masks(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    low: float,
    high: float,
    dual_c: float | None = None,
) -> dict[str, torch.Tensor]:
    """Boolean masks of tokens whose PPO gradient is zeroed, by cause.

    lower: A < 0 ∧ r < L; upper: A > 0 ∧ r > H; dual: A < 0 ∧ r > c; any: their union.
    """
    neg, pos = advantages < 0, advantages > 0
    lower, upper = neg & (ratio < low), pos & (ratio > high)
    dual = neg & (ratio > dual_c) if dual_c is not None else torch.zeros_like(neg)
    return {"lower": lower, "upper": upper, "dual": dual, "any": lower | upper | dual}


def clip_fractions(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    dual_c: float | None = None,
) -> dict[str, float]:
    """Clip fractions split by sign (`clip_lower_frac_neg = #lower / |M⁻|`, …) and over all tokens."""
    valid = mask > 0
    masks = clip_masks(ratio, advantages, low, high, dual_c)
    n_neg = float((valid & (advantages < 0)).sum())
    n_pos = float((valid & (advantages > 0)).sum())
    n_all = float(valid.sum())
    count = {k: float((v & valid).sum()) for k, v in masks.items()}

    def div(a: float, b: float) -> float:
        return a / b if b > 0 else 0.0

    return {
        "clip_lower_frac_neg": div(count["lower"], n_neg),
        "clip_upper_frac_pos": div(count["upper"], n_pos),
        "clip_dual_frac_neg": div(count["dual"], n_neg),
        "clip_lower_frac": div(count["lower"], n_all),
        "clip_upper_frac": div(count["upper"], n_all),
        "clip_dual_frac": div(count["dual"], n_all),
        "clip_frac": div(count["any"], n_all),
    }


def overclip_mask(
    fp8_ratio: Tensor,
    bf16_ratio: Tensor,
    advantages: Tensor,
    low: float,
    high: float,
    dual_c: float | None = None,
) -> torch.Tensor:
    """`O = clipped(r̃; L0, H0) ∧ ¬clipped(r; L0, H0)`: tokens zeroed only because of FP8 noise."""
    fp8 = clip_masks(fp8_ratio, advantages, low, high, dual_c)["any"]
    bf16 = clip_masks(bf16_ratio, advantages, low, high, dual_c)["any"]
    return fp8 & ~bf16


def overclip_stats(
    fp8_ratio: Tensor,
    bf16_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    low: float,
    high: float,
    dual_c: float | None = None,
) -> dict[str, float]:
    """`overclip_frac = |O|/|M|`, `overclip_low_share = |O ∩ M⁻|/|O|` (paper ≈ 70 %),
    `clip_ratio_fp8_vs_bf16` = FP8 over BF16 clipped-token count at nominal bounds (paper ≈ 4x)."""
    valid = torch.ones_like(advantages, dtype=torch.bool) if mask is None else mask > 0
    over = overclip_mask(fp8_ratio, bf16_ratio, advantages, low, high, dual_c) & valid
    n_over, n_valid = float(over.sum()), float(valid.sum())
    n_fp8 = float((clip_masks(fp8_ratio, advantages, low, high, dual_c)["any"] & valid).sum())
    n_bf16 = float((clip_masks(bf16_ratio, advantages, low, high, dual_c)["any"] & valid).sum())
    return {
        "overclip_frac": n_over / n_valid if n_valid else 0.0,
        "overclip_low_share": float((over & (advantages < 0)).sum()) / n_over if n_over else 0.0,
        "clip_ratio_fp8_vs_bf16": n_fp8 / n_bf16 if n_bf16 else (math.inf if n_fp8 else math.nan),
    }


def overclip_high_entropy_share(
    fp8_ratio: Tensor,
    bf16_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    token_entropy: Tensor,
    low: float,
    high: float,
    dual_c: float | None = None,
    quantile: float = 0.9,
) -> dict[str, float]:
    """Share of over-clipped tokens in high-entropy responses (paper ≈ 90 %). Tensors are [B, S].

    Per response `H̄_i = mean_t H_t` over valid tokens; high-entropy means `H̄_i ≥ τ`, τ = the
    `quantile` of H̄ over the batch's responses with at least one valid token.
    """
    valid = mask > 0
    lengths = valid.sum(-1)
    has = lengths > 0
    if not bool(has.any()):
        return {"overclip_highent_share": 0.0, "entropy_threshold": math.nan}
    mean_h = (token_entropy * valid).sum(-1) / lengths.clamp(min=1)
    tau = float(torch.quantile(mean_h[has].double(), quantile))
    high_resp = (mean_h >= tau) & has
    over = overclip_mask(fp8_ratio, bf16_ratio, advantages, low, high, dual_c) & valid
    n_over = float(over.sum())
    share = float((over & high_resp[:, None]).sum()) / n_over if n_over else 0.0
    return {"overclip_highent_share": share, "entropy_threshold": tau}


# ---- entropy ----------------------------------------------------------------------------------
def token_entropy(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Per-position entropy `H = −Σ_v π(v) log π(v)` (nats) from logits [..., V], in chunks.

    Computed in float32 a chunk of positions at a time so [B·S, V] softmax copies stay bounded.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for i in range(0, flat.shape[0], chunk_size):
        logp = torch.log_softmax(flat[i : i + chunk_size].float(), dim=-1)
        out[i : i + chunk_size] = -(logp.exp() * logp).sum(-1)
    return out.reshape(logits.shape[:-1])


# ---- where the clipping comes from: response-entropy quantiles -------------------------------
ENTROPY_QUANTILES = 4


def response_entropy_quantile(
    token_entropy: Tensor, mask: Tensor, n: int = ENTROPY_QUANTILES
) -> torch.Tensor:
    """Each response's entropy quantile within the batch, 1 (lowest) .. `n` (highest); 0 for a
    response without valid tokens. Tensors are [B, S]; returns [B] (int64).

    `H̄_i = Σ_t H_t m_t / Σ_t m_t` (mean per-token entropy of response i); responses are ranked by
    H̄ (stable sort, so ties keep batch order) and rank k of N goes to quantile `1 + ⌊n k / N⌋`:
    equal-sized groups even when many responses share an entropy value.
    """
    valid = mask > 0
    lengths = valid.sum(-1)
    has = lengths > 0
    mean_h = (token_entropy * valid).sum(-1) / lengths.clamp(min=1)
    out = torch.zeros(mean_h.shape, dtype=torch.long)
    idx = torch.nonzero(has).flatten()
    if idx.numel():
        order = torch.sort(mean_h[idx].double(), stable=True).indices
        ranks = torch.empty_like(order)
        ranks[order] = torch.arange(order.numel())
        out[idx] = 1 + (n * ranks) // order.numel()
    return out


def share_by_quantile(
    selected: Tensor,
    mask: Tensor,
    quantile: Tensor,
    prefix: str,
    count_name: str,
    n: int = ENTROPY_QUANTILES,
) -> dict[str, float]:
    """`{prefix}_q{k}` = |S ∩ M ∩ {responses in quantile k}| / |S ∩ M| for k = 1..n, where S is
    `selected` [B, S], M the valid tokens and `quantile` [B] from `response_entropy_quantile`
    (or all three flattened to tokens, each token carrying its response's quantile), plus
    `count_name` = |S ∩ M|, so shares can be pooled over steps (weights). The shares sum to 1;
    all NaN when no valid token is selected (nothing to split)."""
    chosen = (selected & (mask > 0)).reshape(selected.shape[0], -1)
    per_response = chosen.sum(-1).double()
    total = float(per_response.sum())
    out = {count_name: total}
    for k in range(1, n + 1):
        out[f"{prefix}_q{k}"] = (
            float(per_response[quantile == k].sum()) / total if total else math.nan
        )
    return out


def overclip_entropy_split(
    fp8_ratio: Tensor,
    bf16_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    quantile: Tensor,
    low: float,
    n: int = ENTROPY_QUANTILES,
) -> dict[str, float]:
    """Where FP8's extra lower-bound clipping sits (the method: ~90 % in high-entropy responses).

    Over-clipped negative-advantage tokens `O⁻ = {A < 0 ∧ r̃ < L₀ ∧ r ≥ L₀}` (clipped at the lower
    bound L₀ with the FP8 ratio r̃, not with the BF16 shadow ratio r, same tokens and weights),
    and `overclip_share_entropy_q{k}` = the share of O⁻ in responses of entropy quantile k
    (`share_by_quantile`), and their count `overclip_neg_tokens`. Tensors [B, S]; needs a
    shadow pass (r)."""
    neg = advantages < 0
    over = neg & (fp8_ratio < low) & ~(bf16_ratio < low)
    return share_by_quantile(
        over, mask, quantile, "overclip_share_entropy", "overclip_neg_tokens", n
    )


def lower_clip_entropy_split(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    quantile: Tensor,
    low: float,
    n: int = ENTROPY_QUANTILES,
) -> dict[str, float]:
    """The same split for every step, with no shadow pass: lower-clipped negative-advantage
    tokens `C⁻ = {A < 0 ∧ r̃ < L}` (r̃ the token ratio the run trains with, L the bound in force),
    as `clip_lower_share_entropy_q{k}` (count: `clip_lower_neg_tokens`). Under FP8 it holds
    the over-clipped tokens plus those BF16 would clip too."""
    lower = (advantages < 0) & (ratio < low)
    return share_by_quantile(
        lower, mask, quantile, "clip_lower_share_entropy", "clip_lower_neg_tokens", n
    )
