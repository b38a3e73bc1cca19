"""The project's loss as NeMo RL runs it: in place of `ClippedPGLossFn`, inside policy workers.

`NemoCalibratedLoss` is `CalibratedClippedPGLoss` (same maths, config and metrics) with the two
adaptations NeMo RL's data path needs:

1. Shadow log-probs travel in NeMo RL's batch as `[B, S]` tensors, like `prev_logprobs`
   (position i holds the log-prob of token i, position 0 is 0). That keeps them valid under
   NeMo RL's sharding, sequence packing (`SequencePackingLossWrapper` trims every `[B, S]`
   tensor per sequence) and sequence-dimension checks. The project loss takes
   `bf16_curr_logprobs` as `[B, S-1]`, aligned with `next_token_logprobs`; the shift happens here.
2. On calibration steps the loss observes through an `ObservationRecorder`, and the recorded
   statistics are returned under `observations.PAYLOAD_KEY` for the driver to pool
   (see `observations`); the calibrator copy in a worker is discarded after each call.

It imports only this package and torch, so it unpickles in NeMo RL's Megatron worker
environment as long as the package is importable there (the engine exports its location on
PYTHONPATH before Ray starts).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from nemo_fp8_rl.engines.nemo.worker.observations import PAYLOAD_KEY, ObservationRecorder
from nemo_fp8_rl.loss import CalibratedClippedPGLoss

BF16_PREV = "bf16_prev_logprobs"
BF16_CURR = "bf16_curr_logprobs"
SHADOW_KEYS = (BF16_PREV, BF16_CURR)


def shadow_view(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A shallow copy of `data` with `bf16_curr_logprobs` shifted from [B, S] to [B, S-1].

    The shift drops position 0, exactly as the loss does with `prev_logprobs[:, 1:]`, so both
    BF16 log-probs line up with `next_token_logprobs`.
    """
    view = copy.copy(data)
    curr = view[BF16_CURR]
    if curr.shape != view[BF16_PREV].shape:
        raise ValueError(
            f"{BF16_CURR} must have the shape of {BF16_PREV} ([B, S]) in NeMo RL batches, got "
            f"{tuple(curr.shape)} vs {tuple(view[BF16_PREV].shape)}"
        )
    view[BF16_CURR] = curr[:, 1:]
    return view


class NemoCalibratedLoss(CalibratedClippedPGLoss):
    """`CalibratedClippedPGLoss` for NeMo RL's Megatron workers (pass to `grpo_train`).

    Its `input_type` is NeMo RL's own `LossInputType.LOGPROB` when NeMo RL is importable
    (`nemo_fp8_rl.loss.config`), which `prepare_loss_input` compares by identity.
    """

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss and metrics of one micro-batch, plus the recorded shadow statistics if any."""
        present = [k in data for k in SHADOW_KEYS]
        if not any(present):
            return super().__call__(next_token_logprobs, data, global_valid_seqs, global_valid_toks)
        if not all(present):
            raise KeyError(f"a calibration batch needs both {BF16_PREV} and {BF16_CURR}")
        view = shadow_view(data)
        if self.calibrator is None:  # shadow keys without calibration: plain loss
            return super().__call__(next_token_logprobs, view, global_valid_seqs, global_valid_toks)
        calibrator = self.calibrator
        recorder = ObservationRecorder(calibrator)
        self.calibrator = recorder  # type: ignore[assignment]
        try:
            loss, metrics = super().__call__(
                next_token_logprobs, view, global_valid_seqs, global_valid_toks
            )
        finally:
            self.calibrator = calibrator
        metrics[PAYLOAD_KEY] = recorder.recorded
        return loss, metrics
