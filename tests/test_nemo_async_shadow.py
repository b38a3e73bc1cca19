"""Calibrated Clipping on trajectories up to k steps old (asynchronous GRPO), on CPU.

NeMo RL's `async_grpo_train` hands `policy.train` a batch whose `generation_logprobs` come from
the policy that generated it (up to `max_trajectory_age_steps` updates old) and whose
`prev_logprobs` it recomputed with the training weights. Stand-ins: `FakeNemoPolicy`
(test_nemo_fakes) for NeMo RL's Megatron policy (a bigram model, FP8 emulated, the real project
loss pickled per call), and a copy of it one update behind for the generating policy (vLLM).
The shadow passes, the loss, the observations' trip to the driver and the calibrator are the
project's real code.
"""

from __future__ import annotations

import copy

import torch
from test_nemo_fakes import FakeNemoPolicy, make_batch

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.shadow import ShadowPolicy
from nemo_fp8_rl.engines.nemo.worker.loss import NemoCalibratedLoss
from nemo_fp8_rl.engines.nemo.worker.observations import ShadowObservations

torch.set_num_threads(1)
GBS = 8
_REPLAY = ShadowObservations.replay


def _shadow(policy: FakeNemoPolicy) -> tuple[ShadowPolicy, NemoCalibratedLoss]:
    recipe = load_recipe(
        "tiny/grpo-tiny-qwen3-cpu-fp8",
        ["loss_fn.calibration.min_tokens=8", "loss_fn.calibration.interval=1"],
    )
    loss = NemoCalibratedLoss(recipe.section("loss_fn"))
    shadow = ShadowPolicy(
        policy,
        loss,
        start_step=1,
        global_batch_size=GBS,
        switch=policy.switch,
        hold_schedule=policy.hold_schedule,
    )
    return shadow, loss


def _one_step_old_batch(trainer: FakeNemoPolicy, behind: FakeNemoPolicy) -> dict:
    """The batch async_grpo_train builds: generation log-probs of the generating policy (one
    update behind), prev_logprobs recomputed with the training weights (FP8 on)."""
    batch = make_batch(behind, rows=32)
    batch["generation_logprobs"] = batch["prev_logprobs"]  # what the old policy sampled with
    batch["prev_logprobs"] = trainer.get_logprobs(batch)["logprobs"]
    trainer.calls.clear()
    return batch


def _observed(monkeypatch, shadow: ShadowPolicy, loss: NemoCalibratedLoss, batch) -> list[dict]:
    """Run one calibration step; the records replayed into the driver's calibrator."""
    seen: list[dict] = []

    def spy(self, calibrator):
        assert calibrator is loss.calibrator
        seen.extend(self.records)
        return _REPLAY(self, calibrator)

    monkeypatch.setattr(ShadowObservations, "replay", spy)
    results = shadow.train(batch, loss, timer=None)  # async_grpo_train's call
    assert results["all_mb_metrics"]["shadow_tokens"][0] > 0
    return seen


def test_old_trajectories_reach_the_calibrator_with_ratios_against_the_training_weights(
    monkeypatch,
) -> None:
    behind = FakeNemoPolicy(seed=0)
    trainer = copy.deepcopy(behind)
    trainer.train(make_batch(trainer, rows=16, seed=7), _shadow(trainer)[1])  # one update ahead
    trainer.calls.clear()
    stale = _one_step_old_batch(trainer, behind)
    fresh = copy.deepcopy(stale)
    fresh["generation_logprobs"] = fresh["prev_logprobs"].clone()  # as if generated on-policy

    runs = []
    for batch in (stale, fresh):
        policy = copy.deepcopy(trainer)
        shadow, loss = _shadow(policy)
        runs.append(_observed(monkeypatch, shadow, loss, batch))
        assert loss.calibrator is not None and loss.calibrator.bounds is not None
    first = GBS // FakeNemoPolicy().mbs  # records of mini-batch 0 (before any update)
    for run in runs:  # θ_old is the training weights: both ratios are 1 before the first update,
        for key in ("fp8_ratio", "bf16_ratio"):  # however old the trajectories are
            head = torch.cat([r[key] for r in run[:first]])
            assert torch.equal(head, torch.ones_like(head)), key
            tail = torch.cat([r[key] for r in run[first:]])
            assert (tail - 1).abs().max() > 1e-3, key  # later mini-batches: the ratio moves
    assert not torch.equal(stale["generation_logprobs"], stale["prev_logprobs"])
    w_old, w_new = (torch.cat([r["weights"] for r in run[:first]]) for run in runs)
    assert torch.allclose(w_new, torch.ones_like(w_new))  # on-policy: IS weight 1
    assert not torch.allclose(w_old, w_new)  # the age enters through the TIS weight
