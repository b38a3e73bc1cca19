"""Diagnostics: hand-computed mismatch metrics, clip fractions by sign, entropy, surge detector."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_fp8_rl.analysis import surge
from nemo_fp8_rl.calibration import diagnostics as diag

T = torch.tensor


def test_prob_and_ratio_nmae_by_hand() -> None:
    p16, p8 = T([0.5, 0.2, 0.1]), T([0.55, 0.18, 0.1])
    mask = T([1.0, 1.0, 0.0])
    assert diag.prob_nmae(p8.log(), p16.log(), mask) == pytest.approx((0.05 + 0.02) / 0.7)
    assert diag.prob_relative_error(p8.log(), p16.log(), mask) == pytest.approx((0.1 + 0.1) / 2)
    r16, r8 = T([1.0, 0.8, 2.0]), T([1.1, 0.7, 5.0])
    assert diag.ratio_nmae(r8, r16, mask) == pytest.approx(0.2 / 1.8)
    amp = diag.ratio_amplification(r8, r16, p8.log(), p16.log(), mask)
    assert amp == pytest.approx((0.2 / 1.8) / (0.07 / 0.7))


def test_mismatch_metrics_by_hand() -> None:
    f64 = torch.float64
    gen, prev, mask = (
        T([-1.0, -2.0, -0.5], dtype=f64),
        T([-1.1, -1.8, -9.0], dtype=f64),
        T([1.0, 1.0, 0.0], dtype=f64),
    )
    d = prev - gen  # log(π_train / π_gen) on the two valid tokens: −0.1, 0.2
    assert diag.token_mult_prob_error(gen, prev, mask) == pytest.approx(
        (math.exp(0.1) + math.exp(0.2)) / 2
    )
    k3 = [math.exp(x) - 1 - x for x in (-0.1, 0.2)]
    assert diag.gen_kl_error(gen, prev, mask) == pytest.approx(sum(k3) / 2)
    k3p = [math.exp(-x) - 1 + x for x in (-0.1, 0.2)]
    assert diag.policy_kl_error(gen, prev, mask) == pytest.approx(sum(k3p) / 2)
    assert diag.gen_kl_error(gen, prev, mask, normalizer=4.0) == pytest.approx(sum(k3) / 4)
    assert float(d[0]) == pytest.approx(-0.1)
    pm, qm = math.exp(-1.1), math.exp(-1.0)
    mix = 0.5 * (pm + qm)
    jsd0 = 0.5 * (pm / mix - 1 - math.log(pm / mix)) + 0.5 * (qm / mix - 1 - math.log(qm / mix))
    pm, qm = math.exp(-1.8), math.exp(-2.0)
    mix = 0.5 * (pm + qm)
    jsd1 = 0.5 * (pm / mix - 1 - math.log(pm / mix)) + 0.5 * (qm / mix - 1 - math.log(qm / mix))
    assert diag.js_divergence_error(gen, prev, mask) == pytest.approx((jsd0 + jsd1) / 2)


@pytest.mark.parametrize(
    ("kind", "expected"), [("k1", 0.3), ("k2", 0.045), ("k3", math.exp(-0.3) - 1 + 0.3)]
)
def test_kl_estimate_types_and_clamps(kind: str, expected: float) -> None:
    lp, ref = T([-1.0]), T([-1.3])
    assert float(diag.kl_estimate(lp, ref, kind)) == pytest.approx(expected)
    assert float(diag.kl_estimate(lp, ref, "k1", input_clamp=0.1)) == pytest.approx(0.1)
    assert float(diag.kl_estimate(lp, ref, "k1", output_clamp=0.2)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="k1', 'k2' or 'k3"):
        diag.kl_estimate(lp, ref, "k4")


def test_clip_fractions_split_by_sign_and_bound() -> None:
    ratio = T([0.5, 0.9, 3.5, 1.5, 1.1, 0.6, 1.0])
    adv = T([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 0.0])
    mask = torch.ones(7)
    f = diag.clip_fractions(ratio, adv, mask, 0.8, 1.2, dual_c=3.0)
    assert f["clip_lower_frac_neg"] == pytest.approx(1 / 3)  # 0.5
    assert f["clip_dual_frac_neg"] == pytest.approx(1 / 3)  # 3.5
    assert f["clip_upper_frac_pos"] == pytest.approx(
        1 / 3
    )  # 1.5 (0.6 with A > 0 keeps its gradient)
    assert f["clip_frac"] == pytest.approx(3 / 7)
    assert diag.clip_fractions(ratio, adv, mask, 0.8, 1.2)["clip_dual_frac_neg"] == 0.0


def test_overclip_decomposition() -> None:
    # FP8 clips tokens 0, 1 (neg, lower) and 3 (pos, upper); BF16 clips only token 0
    r8 = T([0.5, 0.7, 0.9, 1.3, 1.0])
    r16 = T([0.6, 0.85, 0.9, 1.1, 1.0])
    adv = T([-1.0, -1.0, -1.0, 1.0, 1.0])
    s = diag.overclip_stats(r8, r16, adv, None, 0.8, 1.2)
    assert s["overclip_frac"] == pytest.approx(2 / 5)
    assert s["overclip_low_share"] == pytest.approx(1 / 2)
    assert s["clip_ratio_fp8_vs_bf16"] == pytest.approx(3.0)


def test_overclip_high_entropy_share() -> None:
    r8 = T([[0.5, 1.0], [0.7, 1.0], [1.0, 1.0]])
    r16 = torch.ones(3, 2)
    adv = -torch.ones(3, 2)
    mask = torch.ones(3, 2)
    ent = T([[2.0, 2.0], [0.1, 0.1], [0.5, 0.5]])
    out = diag.overclip_high_entropy_share(r8, r16, adv, mask, ent, 0.8, 1.2, quantile=0.6)
    assert out["entropy_threshold"] == pytest.approx(
        float(torch.quantile(T([2.0, 0.1, 0.5]).double(), 0.6))
    )
    assert out["overclip_highent_share"] == pytest.approx(
        0.5
    )  # 2 over-clipped tokens, 1 in response 0


def test_token_entropy_matches_definition_and_chunks() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    p = logits.softmax(-1)
    expected = -(p * p.log()).sum(-1)
    assert torch.allclose(diag.token_entropy(logits, chunk_size=4), expected, atol=1e-6)
    assert float(diag.token_entropy(torch.zeros(1, 8))) == pytest.approx(math.log(8))


def series_with_surge(n: int = 120, onset: int = 80) -> list[float]:
    g = torch.Generator().manual_seed(1)
    base = 0.6 + 0.01 * torch.randn(n, generator=g)
    rise = torch.clamp(torch.arange(n) - onset + 1, min=0).float() * 0.1
    return (base + rise).tolist()


def test_surge_detector_finds_onset_online_and_offline() -> None:
    values = series_with_surge()
    det = surge.EntropySurgeDetector(window=20, z_threshold=4.0, min_rise=0.05)
    flags = [det.update(step, v) for step, v in enumerate(values)]
    assert det.onsets == [80] and flags.index(True) == 80 and sum(flags) == 1
    assert surge.detect_entropy_surges(
        range(len(values)), values, window=20, z_threshold=4.0, min_rise=0.05
    ) == [80]


def test_surge_detector_ignores_noise_small_rises_and_nan() -> None:
    g = torch.Generator().manual_seed(2)
    noise = (0.6 + 0.01 * torch.randn(200, generator=g)).tolist()
    assert surge.detect_entropy_surges(range(200), noise) == []
    small = series_with_surge()
    small = [
        v if i < 80 else v - 0.1 * (i - 79) + 0.03 for i, v in enumerate(small)
    ]  # +0.03 step only
    assert surge.detect_entropy_surges(range(len(small)), small, min_rise=0.05) == []
    with_nan = series_with_surge()
    with_nan[50] = float("nan")
    assert surge.detect_entropy_surges(range(len(with_nan)), with_nan, z_threshold=4.0) == [80]
    with pytest.raises(ValueError, match="min_history"):
        surge.EntropySurgeDetector(window=3, min_history=5)
