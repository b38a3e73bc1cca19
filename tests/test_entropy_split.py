"""Where the clipping comes from: response-entropy quartiles and the shares of over-clipped
(and lower-clipped) negative-advantage tokens in each, by hand and from a real trainer step."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_fp8_rl.calibration import diagnostics as diag


def test_quartiles_rank_responses_by_mean_entropy_with_equal_groups():
    # 8 responses; mean entropies 0.8, 0.1, 0.5, 0.3, 0.7, 0.2, 0.6, 0.4 (padding not counted)
    means = torch.tensor([0.8, 0.1, 0.5, 0.3, 0.7, 0.2, 0.6, 0.4])
    ent = means[:, None].repeat(1, 3)
    ent[:, 2] = 99.0  # padding position
    mask = torch.ones(8, 3)
    mask[:, 2] = 0
    q = diag.response_entropy_quantile(ent, mask)
    assert q.tolist() == [4, 1, 3, 2, 4, 1, 3, 2]
    mask[3] = 0  # a response with no valid token gets 0 and is not ranked
    q = diag.response_entropy_quantile(ent, mask)
    assert q[3] == 0 and sorted(q[q > 0].tolist()) == [1, 1, 2, 2, 3, 3, 4]


def test_ties_still_give_equal_groups():
    q = diag.response_entropy_quantile(torch.ones(8, 2), torch.ones(8, 2))
    assert sorted(q.tolist()) == [1, 1, 2, 2, 3, 3, 4, 4]


def test_overclip_shares_by_hand():
    """Four responses of two tokens, one per quartile. Over-clipped A<0 tokens (FP8 ratio < 0.8,
    BF16 ratio >= 0.8): two in Q4, one in Q1; a token BF16 clips too does not count, nor an A>0
    token, nor a padded one."""
    quartile = torch.tensor([1, 2, 3, 4])
    adv = torch.tensor([[-1.0, -1.0], [1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    r8 = torch.tensor([[0.7, 1.0], [0.5, 1.0], [0.6, 1.0], [0.7, 0.75]])
    r16 = torch.tensor([[0.9, 1.0], [0.9, 1.0], [0.7, 1.0], [0.95, 0.85]])
    mask = torch.ones(4, 2)
    mask[0, 1] = 0
    out = diag.overclip_entropy_split(r8, r16, adv, mask, quartile, low=0.8)
    assert out == pytest.approx(
        {
            "overclip_share_entropy_q1": 1 / 3,
            "overclip_share_entropy_q2": 0.0,  # A > 0 there
            "overclip_share_entropy_q3": 0.0,  # BF16 clips it as well
            "overclip_share_entropy_q4": 2 / 3,
            "overclip_neg_tokens": 3.0,
        }
    )
    lower = diag.lower_clip_entropy_split(r8, adv, mask, quartile, low=0.8)
    assert lower["clip_lower_share_entropy_q3"] == pytest.approx(1 / 4)
    assert lower.pop("clip_lower_neg_tokens") == 4.0
    assert sum(lower.values()) == pytest.approx(1.0)
    flat = diag.overclip_entropy_split(  # token-level form: each token carries its quartile
        r8.reshape(-1),
        r16.reshape(-1),
        adv.reshape(-1),
        mask.reshape(-1),
        quartile[:, None].expand(4, 2).reshape(-1),
        low=0.8,
    )
    assert flat == pytest.approx(out)


def test_nothing_clipped_gives_nan_shares():
    out = diag.overclip_entropy_split(
        torch.ones(2, 2),
        torch.ones(2, 2),
        -torch.ones(2, 2),
        torch.ones(2, 2),
        torch.tensor([1, 4]),
        low=0.8,
    )
    assert out.pop("overclip_neg_tokens") == 0.0
    assert all(math.isnan(v) for v in out.values()) and len(out) == 4


def test_trainer_step_logs_the_split(tmp_path, monkeypatch):
    """A real FP8 trainer step with a shadow pass (the calibrated recipe calibrates at step 0)."""
    from tests.test_local_step import _step

    _, _, m = _step("grpo-tiny-qwen3-cpu-fp8", tmp_path, monkeypatch)
    lower = [m[f"train/clip_lower_share_entropy_q{k}"] for k in range(1, 5)]
    over = [m[f"train/overclip_share_entropy_q{k}"] for k in range(1, 5)]
    for shares, count in ((lower, "clip_lower_neg_tokens"), (over, "overclip_neg_tokens")):
        n = m[f"train/{count}"]
        assert n == int(n) >= 0
        assert sum(shares) == pytest.approx(1.0) if n else all(math.isnan(v) for v in shares)
    assert "train/prob_nmae" in m  # it was a shadow step
