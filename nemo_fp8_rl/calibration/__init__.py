"""Calibrated Clipping: FP8 clip bounds re-derived from BF16 shadow passes.

`bounds` holds the pure functions (quantile matching of the lower bound, ρ rebalancing of the
upper bound, smoothing and caps), `lower_pool` the pooling of calibration windows behind L*,
`order_interval` the distribution-free interval of L*, and `calibrator` the `Calibrator`
state machine. Method: `calibrated-clipping.md` §2; the rule as built and where
it departs from the method: `docs/calibrated-clipping.md`.
"""

from nemo_fp8_rl.calibration.bounds import (
    Samples,
    UpperTarget,
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
from nemo_fp8_rl.calibration.lower_pool import LowerPool, PooledTarget
from nemo_fp8_rl.calibration.order_interval import LowerInterval, lower_target_interval

__all__ = [
    "Calibrator",
    "LowerInterval",
    "LowerPool",
    "PooledTarget",
    "Samples",
    "UpperTarget",
    "all_gather_rows",
    "inverted_cdf_quantile",
    "lower_clip_fraction",
    "lower_target",
    "lower_target_interval",
    "prepare_samples",
    "smooth_and_cap",
    "update_balance",
    "updates_per_rollout_batch",
    "upper_target",
]
