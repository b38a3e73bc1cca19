"""Shadow-pass scheduling, statistics reduction and bound hand-off of `ShadowPolicy` (CPU).

NeMo RL's policy needs GPU workers; `FakeNemoPolicy` (test_nemo_fakes) stands in for it and
runs the real project loss, pickled per call, on a tiny bigram model with emulated FP8.
"""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from test_nemo_fakes import FakeNemoPolicy, make_batch

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.checkpoint import CALIBRATOR_FILE
from nemo_fp8_rl.engines.nemo.driver.shadow import (
    ShadowPolicy,
    merge_train_results,
    minibatch_bounds,
)
from nemo_fp8_rl.engines.nemo.worker.loss import NemoCalibratedLoss
from nemo_fp8_rl.engines.nemo.worker.observations import PAYLOAD_KEY

torch.set_num_threads(1)
GBS = 8


def _loss(*overrides: str) -> NemoCalibratedLoss:
    base = ["loss_fn.calibration.min_tokens=8", "loss_fn.calibration.interval=2"]
    recipe = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", [*base, *overrides])
    return NemoCalibratedLoss(recipe.section("loss_fn"))


def _shadow(policy: FakeNemoPolicy, loss: NemoCalibratedLoss, start: int = 0) -> ShadowPolicy:
    return ShadowPolicy(
        policy,
        loss,
        start_step=start,
        global_batch_size=GBS,
        switch=policy.switch,
        hold_schedule=policy.hold_schedule,
    )


def _bf16_passes(policy: FakeNemoPolicy) -> list[int]:
    return [rows for name, fp8, rows in policy.calls if name == "get_logprobs" and not fp8]


def test_minibatch_bounds_and_error() -> None:
    assert minibatch_bounds(24, 8) == [(0, 8), (8, 16), (16, 24)]
    with pytest.raises(ValueError, match="not a multiple of policy.train_global_batch_size"):
        minibatch_bounds(20, 8)


def test_schedule_runs_shadow_passes_only_on_calibration_steps() -> None:
    policy, loss = FakeNemoPolicy(), _loss()
    shadow = _shadow(policy, loss)
    passes = []
    for _ in range(5):
        policy.calls.clear()
        batch = make_batch(policy, rows=32, seed=len(passes))
        results = shadow.train(batch, loss)
        passes.append(_bf16_passes(policy))
        assert PAYLOAD_KEY not in results["all_mb_metrics"]
    # interval 2 from step 0: steps 0, 2, 4. In-loop: whole batch, then mini-batches 2..n.
    assert passes == [[32, 8, 8, 8], [], [32, 8, 8, 8], [], [32, 8, 8, 8]]
    assert policy.fp8_on  # always switched back
    assert policy.schedule_ticks == 5  # one LR tick per GRPO step, split or not


def test_in_loop_split_trains_exactly_like_one_call() -> None:
    """Four single-global-batch calls == one four-batch call: weights, losses, logged metrics."""
    ref_policy, policy = FakeNemoPolicy(), FakeNemoPolicy()
    batch = make_batch(ref_policy, rows=32)
    plain = ref_policy.train(batch, _loss("loss_fn.calibration.enabled=false"), gbs=GBS)
    results = _shadow(policy, _loss()).train(batch, _loss(), gbs=GBS)  # a calibration step
    assert policy.train_sizes == [8, 8, 8, 8] and ref_policy.train_sizes == [32]
    assert policy.schedule_ticks == ref_policy.schedule_ticks == 1 and not policy.schedule_held
    torch.testing.assert_close(policy.out, ref_policy.out)
    torch.testing.assert_close(results["loss"], plain["loss"])
    for key in ("loss", "clip_frac", "token_mult_prob_error", "calib_low", "calib_high"):
        assert sum(results["all_mb_metrics"][key]) == pytest.approx(
            sum(plain["all_mb_metrics"][key])
        )
    assert sum(results["all_mb_metrics"]["calib_low"]) == pytest.approx(0.8)


def test_statistics_pooled_over_data_parallel_ranks() -> None:
    """Two DP ranks deliver the same pooled statistics as one rank holding every token."""
    out = {}
    for dp in (1, 2):
        policy = FakeNemoPolicy(dp=dp, mbs=2)
        loss = _loss()
        batch = make_batch(policy, rows=32)
        metrics = _shadow(policy, loss).train(batch, loss)["all_mb_metrics"]
        valid = batch["token_mask"][:, 1:].sum().item()
        assert metrics["shadow_tokens"] == [valid]
        out[dp] = {k: v[0] for k, v in metrics.items() if k.startswith("calib_") and len(v) == 1}
    assert out[1]["calib_n_neg"] + out[1]["calib_n_pos"] > 0
    assert out[1].keys() == out[2].keys()
    for key, value in out[1].items():
        assert out[2][key] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), key


def test_new_bounds_reach_the_workers_from_the_next_step() -> None:
    policy, loss = FakeNemoPolicy(lr=6.0), _loss("loss_fn.calibration.max_step_low=0.2")
    shadow = _shadow(policy, loss)
    first = shadow.train(make_batch(policy, seed=1), loss)["all_mb_metrics"]
    moved = loss.calibrator.bounds
    assert moved != (0.8, 1.2), "calibration should move the bounds on this batch"
    assert first["calib_alpha"][0] >= 0.0
    assert sum(first["calib_low"]) == pytest.approx(0.8)  # in force during step 0
    worker_copy = pickle.loads(pickle.dumps(loss))
    assert worker_copy.calibrator.bounds == moved
    second = shadow.train(make_batch(policy, seed=2), loss)["all_mb_metrics"]
    assert sum(second["calib_low"]) == pytest.approx(moved[0])
    assert "calib_alpha" not in second


def test_end_of_step_mode_probes_new_weights_without_training_on_them() -> None:
    policy, loss = FakeNemoPolicy(), _loss("loss_fn.calibration.mode=end_of_step")
    batch = make_batch(policy, rows=16)
    before = policy.out.detach().clone()
    metrics = _shadow(policy, loss).train(batch, loss)["all_mb_metrics"]
    assert [c for c in policy.calls if c[0] == "train"] == [
        ("train", False, 16),
        ("train", True, 16),
    ]
    assert _bf16_passes(policy) == [16, 16]
    assert not torch.equal(before, policy.out)
    assert metrics["shadow_tokens"][0] == batch["token_mask"][:, 1:].sum().item()
    assert "calib_n_neg" in metrics


def test_uncalibrated_loss_passes_through_with_sign_fractions() -> None:
    policy, loss = FakeNemoPolicy(lr=6.0), _loss("loss_fn.calibration.enabled=false")
    shadow = _shadow(policy, loss)
    batch = make_batch(policy)
    metrics = shadow.train(batch, loss)["all_mb_metrics"]
    assert _bf16_passes(policy) == [] and not any(k.startswith("calib_a") for k in metrics)
    assert shadow.offload_after_refit() == "offloaded"
    lower, neg = sum(metrics["clip_lower_frac"]), sum(metrics["neg_token_frac"])
    assert 0 < neg < 1 and metrics["clip_lower_frac_neg"] == [pytest.approx(lower / neg)]
    assert len(metrics["clip_upper_frac_pos"]) == len(metrics["clip_dual_frac_neg"]) == 1


def test_stray_observations_on_a_normal_step_are_an_error() -> None:
    policy, loss = FakeNemoPolicy(), _loss()
    shadow = _shadow(policy, loss, start=1)  # step 1 is not a calibration step
    batch = make_batch(policy)
    batch["bf16_prev_logprobs"] = batch["prev_logprobs"].clone()
    batch["bf16_curr_logprobs"] = batch["prev_logprobs"].clone()
    with pytest.raises(RuntimeError, match="not a calibration step"):
        shadow.train(batch, loss)


def test_save_checkpoint_writes_calibrator_state_into_the_step_folder(tmp_path) -> None:
    policy, loss = FakeNemoPolicy(), _loss()
    shadow = _shadow(policy, loss)
    shadow.train(make_batch(policy), loss)
    weights = tmp_path / "tmp_step_1" / "policy" / "weights"
    shadow.save_checkpoint(weights_path=str(weights), optimizer_path=None)
    state = json.loads((tmp_path / "tmp_step_1" / CALIBRATOR_FILE).read_text())
    assert state["bounds"] == list(loss.calibrator.bounds)
    assert state["last_calibration_step"] == 0
    assert policy.saved == [str(weights)]


def test_merge_keeps_extrema_and_means_unscaled() -> None:
    parts = [
        {
            "loss": torch.tensor([1.0]),
            "grad_norm": torch.tensor([3.0]),
            "all_mb_metrics": {"loss": [1.0], "probs_ratio_min": [0.5], "lr": [1e-4]},
        },
        {
            "loss": torch.tensor([2.0]),
            "grad_norm": torch.tensor([4.0]),
            "all_mb_metrics": {"loss": [2.0], "probs_ratio_min": [0.7], "lr": [1e-4]},
        },
    ]
    merged = merge_train_results(parts)
    assert merged["loss"].tolist() == [1.0, 2.0]
    assert merged["grad_norm"].tolist() == [4.0]
    assert merged["all_mb_metrics"] == {
        "loss": [0.5, 1.0],
        "probs_ratio_min": [0.5, 0.7],
        "lr": [1e-4, 1e-4],
    }
