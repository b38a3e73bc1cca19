"""Calibrated Clipping: FP8 clip bounds re-derived from BF16 shadow passes.

`bounds` holds the pure functions (quantile matching of the lower bound, ρ rebalancing of the
upper bound, smoothing and caps); `calibrator` holds the `Calibrator` state machine. Specification:
`calibrated-clipping.md` §2.
"""

from nemo_fp8_rl.calibration.bounds import (
    Samples,
    inverted_cdf_quantile,
    lower_clip_fraction,
    lower_target,
    prepare_samples,
    smooth_and_cap,
    update_balance,
    upper_target,
)
from nemo_fp8_rl.calibration.calibrator import (
    Calibrator,
    all_gather_rows,
    updates_per_rollout_batch,
)

__all__ = [
    "Calibrator",
    "Samples",
    "all_gather_rows",
    "inverted_cdf_quantile",
    "lower_clip_fraction",
    "lower_target",
    "prepare_samples",
    "smooth_and_cap",
    "update_balance",
    "updates_per_rollout_batch",
    "upper_target",
]
