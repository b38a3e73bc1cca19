"""CalibratedClippedPGLoss with calibration off equals NeMo RL's ClippedPGLossFn.

The reference below is written from NeMo RL's published formulas (`ClippedPGLossFn` docstring and
`docs/guides/grpo.md`, commit 7ea279a); `test_loss_nemo_rl.py` compares against the real class
when a NeMo RL source tree is available.
"""

from __future__ import annotations

import math

import pytest
import torch

from nemo_fp8_rl.loss import CalibratedClippedPGLoss, LossType, derive_sign_fractions

torch.set_num_threads(1)

CONFIGS = {
    "default": {},
    "asymmetric_dual_clip": {"ratio_clip_max": 0.28, "ratio_clip_c": 3.0},
    "is_plain": {"use_importance_sampling_correction": True},
    "tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.5,
    },
    "tis_min": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.5,
        "truncated_importance_sampling_ratio_min": 0.7,
    },
    "icepop": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": 1.3,
        "truncated_importance_sampling_ratio_min": 0.8,
    },
    "seq_mask_tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio": 1.1,
        "truncated_importance_sampling_ratio_min": 0.9,
    },
    "sequence_level_loss": {"token_level_loss": False, "ratio_clip_c": 2.5},
    "gspo": {
        "token_level_loss": False,
        "sequence_level_importance_ratios": True,
        "use_importance_sampling_correction": True,
    },
    "k1_onpolicy_kl": {"reference_policy_kl_type": "k1", "use_on_policy_kl_approximation": True},
    "k2_clamped": {
        "reference_policy_kl_type": "k2",
        "kl_input_clamp_value": 0.3,
        "kl_output_clamp_value": 0.05,
    },
    "no_kl": {"reference_policy_kl_penalty": 0.0},
    "kl_in_reward": {"use_kl_in_reward": True},
    "cispo": {"use_cispo": True, "ratio_clip_min": 1.0, "ratio_clip_max": 5.0},
    "reinforce": {"disable_ppo_ratio": True},
    "force_on_policy": {"force_on_policy_ratio": True},
    "vapo_nll": {"positive_example_nll_weight": 0.3},
}


def make_batch(
    seed: int, b: int = 6, s: int = 17, spread: float = 0.3
) -> tuple[torch.Tensor, dict]:
    """Random GRPO-like micro-batch: per-sequence advantages, ragged token masks, one dropped sample."""
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(b, s)
    for i in range(b):
        start = int(torch.randint(1, 5, (1,), generator=g))
        end = int(torch.randint(start + 3, s + 1, (1,), generator=g))
        token_mask[i, start:end] = 1.0
    sample_mask = torch.ones(b)
    sample_mask[-1] = 0.0
    adv = torch.randn(b, 1, generator=g).expand(b, s).clone()
    adv[0] = 0.0
    gen = -torch.rand(b, s, generator=g) * 3 - 0.05
    prev = gen + 0.4 * torch.randn(b, s, generator=g)
    prev[:, 3] = gen[:, 3] - 3.0  # a far-off-policy token (IS weight 0.05) in every sequence
    ref = prev + 0.2 * torch.randn(b, s, generator=g)
    curr = (prev[:, 1:] + spread * torch.randn(b, s - 1, generator=g)).clamp(max=-1e-3)
    data = {
        "input_ids": torch.randint(0, 100, (b, s), generator=g),
        "advantages": adv,
        "prev_logprobs": prev,
        "generation_logprobs": gen,
        "reference_policy_logprobs": ref,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "rewards": (torch.rand(b, generator=g) > 0.5).float(),
    }
    return curr, data


def mmean(v, m, norm=None, dim=None):
    """NeMo RL's masked_mean: Σ(v·m) / (norm + 1e-8), norm = Σm by default."""
    den = m.sum(dim=dim) if norm is None else norm
    num = (v * m).sum() if dim is None else (v * m).sum(dim=dim)
    return num / (den + 1e-8)


def kl_ref(lp, lp_ref, kind, in_clamp, out_clamp, w=None):
    """Schulman k1/k2/k3 as NeMo RL's calculate_kl (x = lp_ref − lp)."""
    x = lp_ref - lp
    if in_clamp is not None:
        xc = x.clamp(-in_clamp, in_clamp)
        if w is not None:
            w = torch.where(x == xc, w, w.detach())
        x = xc
    kl = {"k1": -x, "k2": x**2 / 2, "k3": torch.exp(x) - 1 - x}[kind]
    if w is not None:
        kl = w * kl
    return kl if out_clamp is None else kl.clamp(-out_clamp, out_clamp)


REF_DEFAULTS = dict(
    disable_ppo_ratio=False, token_level_loss=True, sequence_level_importance_ratios=False,
    ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None, reference_policy_kl_penalty=0.01,
    reference_policy_kl_type="k3", kl_input_clamp_value=20.0, kl_output_clamp_value=10.0,
    use_kl_in_reward=False, use_importance_sampling_correction=False,
    truncated_importance_sampling_type=None, truncated_importance_sampling_ratio=None,
    truncated_importance_sampling_ratio_min=None, use_on_policy_kl_approximation=False,
    force_on_policy_ratio=False, use_cispo=False, positive_example_nll_weight=0.0,
)  # fmt: skip


def ref_mismatch(gen, prev, m, gt, kind):
    """token_mult_prob_error, gen/policy KL (unclamped), JSD: token means over the global count."""
    mix = torch.log(0.5 * prev.exp() + 0.5 * gen.exp())
    jsd = 0.5 * (torch.exp(prev - mix) - (prev - mix) - 1) + 0.5 * (
        torch.exp(gen - mix) - (gen - mix) - 1
    )
    return {
        "token_mult_prob_error": mmean(torch.exp((gen - prev).abs() * m), m, gt).item(),
        "gen_kl_error": mmean(kl_ref(gen, prev, kind, None, None), m, gt).item(),
        "policy_kl_error": mmean(kl_ref(prev, gen, kind, None, None), m, gt).item(),
        "js_divergence_error": mmean(jsd, m, gt).item(),
    }


def ref_ratios(cfg, lp, prev, tm):
    """(r, clamp(r)) for PPO, GSPO (sequence geometric mean), REINFORCE and forced on-policy."""
    if cfg["force_on_policy_ratio"]:
        r = torch.exp(lp - lp.detach())
        return r, r
    if cfg["disable_ppo_ratio"]:
        return lp, lp
    lr = lp - prev
    seq = cfg["sequence_level_importance_ratios"]
    r = mmean(lr, tm, dim=-1)[:, None].exp().repeat(1, lr.shape[1]) if seq else lr.exp()
    return r, r.clamp(1.0 - cfg["ratio_clip_min"], 1.0 + cfg["ratio_clip_max"])


def ref_is_weights(cfg, prev, gen, m, tm, sm, gs, gt, out):
    """IS weights exp(prev − gen) (per sequence for GSPO), then TIS / IcePop / seq-mask-TIS."""
    if cfg["sequence_level_importance_ratios"]:
        w = torch.nan_to_num(torch.exp(((prev - gen) * m).sum(-1)).detach(), 0.0, 0.0, 0.0)[:, None]
    else:
        w = torch.nan_to_num(torch.exp(prev - gen), 0.0, 0.0, 0.0)
    kind = cfg["truncated_importance_sampling_type"]
    tmax, tmin = (
        cfg["truncated_importance_sampling_ratio"],
        cfg["truncated_importance_sampling_ratio_min"],
    )
    if tmax is not None and kind == "tis":
        tmin = 0.0 if tmin is None else tmin
        out["is_oob_ratio"] = mmean(((w > tmax) | (w < tmin)).float(), m, gt).item()
        w = w.clamp(tmin, tmax)
    elif tmax is not None and kind == "icepop":
        keep = (w >= tmin) & (w <= tmax)
        out["is_oob_ratio"] = mmean((~keep).float(), m, gt).item()
        w = torch.where(keep, w, torch.zeros_like(w))
    elif tmax is not None and kind == "seq-mask-tis":
        geo = mmean(torch.nan_to_num(prev - gen, 0.0, 0.0, 0.0), tm, dim=-1).exp()
        keep = ((geo >= tmin) & (geo <= tmax)).float()
        out["is_oob_ratio"] = mmean(1 - keep, sm, gs).item()
        w = w * keep[:, None]
    return w


def nemo_rl_reference(c: dict, lp, data, gs, gt):
    """NeMo RL ClippedPGLossFn (7ea279a) from its published formulas: returns (loss, metrics)."""
    cfg = {**REF_DEFAULTS, **c}
    beta = 0.0 if cfg["use_kl_in_reward"] else cfg["reference_policy_kl_penalty"]
    tm, sm = data["token_mask"][:, 1:], data["sample_mask"]
    adv, gen = data["advantages"][:, 1:], data["generation_logprobs"][:, 1:]
    prev = lp.detach() if cfg["force_on_policy_ratio"] else data["prev_logprobs"][:, 1:]
    m = tm * sm[:, None]

    def reduce(v):
        return mmean(v, m, gt) if cfg["token_level_loss"] else mmean(mmean(v, tm, dim=-1), sm, gs)

    out = ref_mismatch(gen, prev, m, gt, cfg["reference_policy_kl_type"])
    kl = torch.tensor(0.0)
    if beta != 0:
        w_kl = (
            torch.exp(lp - gen)
            if cfg["use_on_policy_kl_approximation"]
            else torch.exp(lp - lp.detach())
        )
        kl = reduce(beta * kl_ref(lp, data["reference_policy_logprobs"][:, 1:], cfg["reference_policy_kl_type"],
                                  cfg["kl_input_clamp_value"], cfg["kl_output_clamp_value"],
                                  torch.nan_to_num(w_kl, 0.0, 0.0, 0.0)))  # fmt: skip
    r, rc = ref_ratios(cfg, lp, prev, tm)
    cl = -adv * rc.detach() * lp if cfg["use_cispo"] else torch.max(-adv * r, -adv * rc)
    if cfg["ratio_clip_c"] is not None:
        cl = torch.where(adv < 0, torch.min(cl, -adv * cfg["ratio_clip_c"]), cl)
    w = ref_is_weights(cfg, prev, gen, m, tm, sm, gs, gt, out)
    actor = reduce((w if cfg["use_importance_sampling_correction"] else torch.ones_like(prev)) * cl)
    sir = mmean(w, sm, gs) if cfg["sequence_level_importance_ratios"] else mmean(w, m, gt)
    nll = torch.tensor(0.0)
    cm = m * (data["rewards"] > 0).float()[:, None]
    if cfg["positive_example_nll_weight"] > 0 and cm.sum() > 0:
        nll = mmean(-lp, cm, cm.sum())
    loss = actor + kl + cfg["positive_example_nll_weight"] * nll
    v, r, rc = m.bool(), r.detach(), rc.detach()
    out.update(
        loss=loss.item(), kl_penalty=kl.item() / beta if bool(kl) else 0,
        sampling_importance_ratio=sir.item(), num_valid_samples=sm.sum().item(),
        approx_entropy=(-mmean(torch.exp(lp - gen) * lp, m, gt)).item(), positive_nll_loss=nll.item(),
        probs_ratio=mmean(r, m, gt).item(), probs_ratio_clamped=mmean(rc, m, gt).item(),
        probs_ratio_min=r[v].min().item(), probs_ratio_max=r[v].max().item(),
        probs_ratio_clamped_min=rc[v].min().item(), probs_ratio_clamped_max=rc[v].max().item(),
    )  # fmt: skip
    return loss, out


def run_both(c: dict, seed: int):
    lp, data = make_batch(seed)
    gs, gt = (
        data["sample_mask"].sum(),
        (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum(),
    )
    lp_a, lp_b = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = CalibratedClippedPGLoss(c)(
        next_token_logprobs=lp_a, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    ref = nemo_rl_reference(c, lp_b, data, gs, gt)
    ours[0].backward()
    ref[0].backward()
    return ours, ref, lp_a.grad, lp_b.grad


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_nemo_rl_formulas(name: str, seed: int) -> None:
    (loss, metrics), (ref_loss, ref_metrics), grad, ref_grad = run_both(CONFIGS[name], seed)
    assert torch.allclose(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert torch.allclose(grad, ref_grad, rtol=1e-6, atol=1e-7)
    assert set(ref_metrics) <= set(metrics)
    for key, value in ref_metrics.items():
        assert math.isclose(metrics[key], value, rel_tol=1e-6, abs_tol=1e-6), key


@pytest.mark.parametrize("name", ["default", "tis", "sequence_level_loss"])
def test_micro_batch_metrics_sum_to_full_batch(name: str) -> None:
    """NeMo RL's rule: per-micro-batch values normalised by global counts sum to the batch value."""
    lp, data = make_batch(7)
    gs, gt = (
        data["sample_mask"].sum(),
        (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum(),
    )
    fn = CalibratedClippedPGLoss(CONFIGS[name])
    full_loss, full = fn(
        next_token_logprobs=lp, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    parts = [
        fn(
            next_token_logprobs=lp[sl],
            data={k: v[sl] for k, v in data.items()},
            global_valid_seqs=gs,
            global_valid_toks=gt,
        )
        for sl in (slice(0, 2), slice(2, 6))
    ]
    assert torch.allclose(sum(p[0] for p in parts), full_loss, atol=1e-6)
    for key in (
        "clip_lower_frac",
        "clip_upper_frac",
        "clip_frac",
        "neg_token_frac",
        "calib_low",
        "gen_kl_error",
    ):
        assert math.isclose(sum(p[1][key] for p in parts), full[key], abs_tol=1e-6), key
    assert math.isclose(sum(p[1]["calib_low"] for p in parts), 0.8, abs_tol=1e-6)


def test_clipped_tokens_get_zero_gradient_unclipped_the_analytic_one() -> None:
    """d loss/d lp_t = −A·r·m/gt when unclipped, 0 when clipped (token level, no KL, no IS)."""
    lp, data = make_batch(3, b=16, s=33, spread=0.4)
    cfg = {"reference_policy_kl_penalty": 0.0, "ratio_clip_max": 0.28, "ratio_clip_c": 2.0}
    fn = CalibratedClippedPGLoss(cfg)
    m = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    gt = m.sum()
    lp = lp.requires_grad_()
    loss, metrics = fn(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=gt,
    )
    loss.backward()
    adv = data["advantages"][:, 1:]
    r = (lp.detach() - data["prev_logprobs"][:, 1:]).exp()
    clipped = ((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8)) | ((adv < 0) & (r > 2.0))
    valid = m > 0
    assert (clipped & valid).sum() > 10 and (~clipped & valid & (adv != 0)).sum() > 10
    assert torch.all(lp.grad[clipped] == 0)
    expected = -adv * r * m / (gt + 1e-8)
    assert torch.allclose(lp.grad[~clipped], expected[~clipped], rtol=1e-5, atol=1e-9)
    assert math.isclose(metrics["clip_frac"], float((clipped & valid).sum() / gt), rel_tol=1e-5)


def test_sign_fractions_from_summed_metrics() -> None:
    lp, data = make_batch(5, b=32, s=33, spread=0.4)
    m = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    _, metrics = CalibratedClippedPGLoss({})(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=m.sum(),
    )
    derived = derive_sign_fractions(metrics)
    adv, r = data["advantages"][:, 1:], (lp - data["prev_logprobs"][:, 1:]).exp()
    neg = (adv < 0) & (m > 0)
    assert math.isclose(
        derived["clip_lower_frac_neg"], float((neg & (r < 0.8)).sum() / neg.sum()), rel_tol=1e-5
    )
    pos = (adv > 0) & (m > 0)
    assert math.isclose(
        derived["clip_upper_frac_pos"], float((pos & (r > 1.2)).sum() / pos.sum()), rel_tol=1e-5
    )
    assert derived["clip_dual_frac_neg"] == 0.0


def test_loss_type_and_interface_attributes() -> None:
    fn = CalibratedClippedPGLoss({"token_level_loss": False})
    assert fn.loss_type == LossType.SEQUENCE_LEVEL and fn.input_type.value == "logprob"
    assert fn.calibrator is None and fn.reference_policy_kl_penalty == 0.01
    assert fn.metric_normalizations["loss"].value == "sequences"


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"ratio_clip_mni": 0.2}, "unknown key"),
        ({"ratio_clip_c": 0.5}, "ratio_clip_c must be > 1"),
        (
            {
                "truncated_importance_sampling_type": "tis",
                "truncated_importance_sampling_ratio": 2.0,
            },
            "use_importance_sampling_correction",
        ),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio": 2.0,
            },
            "ratio_min must be set",
        ),
        ({"sequence_level_importance_ratios": True}, "token_level_loss: false"),
        ({"use_cispo": True, "ratio_clip_c": 3.0}, "ratio_clip_c: null"),
        (
            {
                "token_level_loss": False,
                "sequence_level_importance_ratios": True,
                "calibration": {"enabled": True},
            },
            "calibration.enabled needs",
        ),
        ({"calibration": {"enabled": True, "intervall": 3}}, "intervall"),
    ],
)
def test_bad_config_is_a_clear_error(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CalibratedClippedPGLoss(cfg)


def test_shadow_keys_feed_the_calibrator_with_loss_weights() -> None:
    """On calibration steps the loss passes r̃, r, A and w = IS weight to `observe`."""
    lp, data = make_batch(11, b=8, s=17)
    data["bf16_prev_logprobs"] = data["prev_logprobs"] + 0.01
    data["bf16_curr_logprobs"] = lp + 0.02
    cfg = {**CONFIGS["tis"], "calibration": {"enabled": True, "min_tokens": 1}}
    fn = CalibratedClippedPGLoss(cfg)
    m = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    fn(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=m.sum(),
    )
    rows = fn.calibrator._chunks[0]
    assert rows.shape[0] == int(m.sum())
    r8 = (lp - data["prev_logprobs"][:, 1:]).exp()[m > 0].double()
    assert torch.allclose(rows[:, 0], r8, rtol=1e-6)
    assert torch.allclose(rows[:, 1], r8 * math.exp(0.01), rtol=1e-5)
    w = (
        (data["prev_logprobs"] - data["generation_logprobs"])[:, 1:]
        .exp()
        .clamp(0, 1.5)[m > 0]
        .double()
    )
    assert torch.allclose(rows[:, 3], w, rtol=1e-6)
    del data["bf16_curr_logprobs"]
    with pytest.raises(KeyError, match="both bf16_prev_logprobs and bf16_curr_logprobs"):
        fn(
            next_token_logprobs=lp,
            data=data,
            global_valid_seqs=data["sample_mask"].sum(),
            global_valid_toks=m.sum(),
        )


def test_micro_batch_without_valid_tokens() -> None:
    """NeMo RL's convention: zero loss, ratio extremes ±inf, no NaN."""
    lp, data = make_batch(0)
    data["sample_mask"] = torch.zeros_like(data["sample_mask"])
    loss, metrics = CalibratedClippedPGLoss({})(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=torch.tensor(4.0),
        global_valid_toks=torch.tensor(40.0),
    )
    assert float(loss) == 0.0 and metrics["clip_frac"] == 0.0 and metrics["calib_low"] == 0.0
    assert (
        metrics["probs_ratio_min"] == math.inf and metrics["probs_ratio_clamped_max"] == -math.inf
    )


@pytest.mark.parametrize("q", [0.3, 1.0])
def test_negative_gradient_drop_gives_a_share_q_of_a_neg_tokens_the_clip_zero_gradient(q) -> None:
    """The labelled ablation `loss_fn.ablation.negative_gradient_drop_q`: about a share q of the
    valid A<0 tokens get a zero gradient (as if clipped at L), the loss value is unchanged, A>0
    tokens keep the analytic gradient, and the dropped share is logged."""
    lp, data = make_batch(7, b=64, s=33, spread=0.05)  # spread 0.05: almost nothing clipped
    cfg = {"reference_policy_kl_penalty": 0.0}
    m = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    gs, gt = data["sample_mask"].sum(), m.sum()
    plain, _ = CalibratedClippedPGLoss(cfg)(
        next_token_logprobs=lp, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    lp = lp.clone().requires_grad_()
    fn = CalibratedClippedPGLoss({**cfg, "ablation": {"negative_gradient_drop_q": q}})
    torch.manual_seed(0)
    loss, metrics = fn(
        next_token_logprobs=lp, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    loss.backward()
    assert math.isclose(loss.item(), plain.item(), rel_tol=1e-6)
    adv = data["advantages"][:, 1:]
    r = (lp.detach() - data["prev_logprobs"][:, 1:]).exp()
    neg = (adv < 0) & (m > 0) & (r >= 0.8) & (r <= 1.2)
    zero = neg & (lp.grad == 0)
    assert neg.sum() > 200
    assert abs(float(zero.sum() / neg.sum()) - q) < 0.08
    pos = (adv > 0) & (m > 0) & (r <= 1.2)
    expected = -adv * r * m / (gt + 1e-8)
    assert torch.allclose(lp.grad[pos], expected[pos], rtol=1e-5, atol=1e-9)
    share = derive_sign_fractions(metrics)["neg_grad_drop_frac_neg"]
    assert abs(share - q) < 0.08


def test_negative_gradient_drop_zero_is_the_unmodified_loss() -> None:
    """q = 0 draws nothing and logs nothing: the loss and gradient are the plain loss's."""
    lp, data = make_batch(8, b=16, s=33)
    m = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    state = torch.get_rng_state()
    fn = CalibratedClippedPGLoss({"ablation": {"negative_gradient_drop_q": 0.0}})
    _, metrics = fn(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=m.sum(),
    )
    assert torch.equal(torch.get_rng_state(), state) and "neg_grad_drop_frac" not in metrics
