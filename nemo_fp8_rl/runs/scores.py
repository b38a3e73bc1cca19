"""Which validation score a verdict reads: BF16 generation first, the rollout's own otherwise.

`validation/bf16_accuracy` scores the trained weights with BF16 generation (the embedded engine
logs it at every validation, `engines.local.bf16_scoring`); `validation/accuracy` is the score of
the run's own rollout engine, as NeMo RL logs it: FP8 generation in an FP8 recipe, so it mixes
what training did to the weights with what FP8 does to generation. Runs that lack the BF16 score
(NeMo RL runs, runs written before it existed) fall back to the rollout score, and every report
that does so says which score it read (`accuracy_label`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

BF16_ACCURACY = "validation/bf16_accuracy"
BF16_ACCURACY_SAMPLED = "validation/bf16_accuracy_sampled"
ROLLOUT_ACCURACY = "validation/accuracy"
ROLLOUT_ACCURACY_SAMPLED = "validation/accuracy_sampled"


def accuracy_key(records: Iterable[Mapping[str, Any]]) -> str:
    """`BF16_ACCURACY` if any record holds it, else `ROLLOUT_ACCURACY`."""
    return (
        BF16_ACCURACY
        if any(r.get(BF16_ACCURACY) is not None for r in records)
        else ROLLOUT_ACCURACY
    )


def accuracy_label(key: str) -> str:
    """A short phrase naming how the score `key` was generated."""
    return "BF16-scored" if key == BF16_ACCURACY else "scored in rollout precision"
