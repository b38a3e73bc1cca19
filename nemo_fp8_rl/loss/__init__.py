"""Clipped policy-gradient loss with NeMo RL's interface and calibrated FP8 clip bounds.

`CalibratedClippedPGLoss(loss_cfg)` is a drop-in for NeMo RL's `ClippedPGLossFn`; see
`clipped_pg` for the formulas and `config` for the accepted `loss_fn` keys.
"""

from nemo_fp8_rl.loss.clipped_pg import CalibratedClippedPGLoss, derive_sign_fractions
from nemo_fp8_rl.loss.config import LossInputType, LossType, MetricNormalizer, PGLossConfig

__all__ = [
    "CalibratedClippedPGLoss",
    "LossInputType",
    "LossType",
    "MetricNormalizer",
    "PGLossConfig",
    "derive_sign_fractions",
]
