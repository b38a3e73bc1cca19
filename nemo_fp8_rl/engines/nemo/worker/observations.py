"""Calibration statistics carried from NeMo RL's policy workers back to the driver.

In NeMo RL the loss object is pickled to every policy worker on each `policy.train` call, so
whatever a worker-side `Calibrator` accumulates is lost when the call returns. The statistics
therefore travel in-band, inside the loss metrics that NeMo RL already returns per micro-batch,
from every data-parallel rank, to the driver:

- the worker-side loss observes through an `ObservationRecorder` (same interface as the
  calibrator), which keeps each `observe(...)` call's tensors, restricted to valid tokens;
- the recorded calls ride in the metrics as one `ShadowObservations` value under
  `PAYLOAD_KEY`;
- the driver removes that key from the results before NeMo RL aggregates the metrics and
  replays every call into the one authoritative `Calibrator`, whose `update()` then sees the
  pooled statistics of all ranks: the data-parallel reduction is this gather to the driver.

NeMo RL applies arithmetic to metric values on the way (`SequencePackingLossWrapper` sums the
per-sequence values starting from 0; the Megatron worker divides per-micro-batch values by the
number of global batches). `ShadowObservations` defines those operations as what they mean for
a record list: `+` concatenates, `0 + x` is `x`, and division by a count leaves it unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

PAYLOAD_KEY = "shadow_observations"


class ShadowObservations:
    """A list of recorded `Calibrator.observe` calls (CPU tensors over valid tokens only)."""

    def __init__(self, records: list[dict[str, torch.Tensor]] | None = None) -> None:
        self.records: list[dict[str, torch.Tensor]] = list(records or [])

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_tokens(self) -> int:
        """Valid tokens recorded, over all calls."""
        return sum(int(r["fp8_ratio"].numel()) for r in self.records)

    def __add__(self, other: Any) -> ShadowObservations:
        if isinstance(other, ShadowObservations):
            return ShadowObservations(self.records + other.records)
        if isinstance(other, int | float) and other == 0:
            return self
        return NotImplemented

    __radd__ = __add__

    def __truediv__(self, count: Any) -> ShadowObservations:
        """Division by a micro-/global-batch count: the records are data, not an average."""
        return self

    def replay(self, calibrator: Any) -> int:
        """Feed every recorded call to `calibrator.observe`; returns the number of calls."""
        for record in self.records:
            calibrator.observe(**record)
        return len(self.records)

    def __repr__(self) -> str:
        return f"ShadowObservations(calls={len(self)}, tokens={self.num_tokens})"


def _compress(kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Detach, move to CPU, and keep only tokens where `mask > 0` (flattened; mask dropped)."""
    mask = kwargs.pop("mask", None)
    ref = kwargs["fp8_ratio"]
    valid = torch.ones_like(ref, dtype=torch.bool) if mask is None else mask.detach() > 0
    out = {}
    for name, value in kwargs.items():
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape:
            value = torch.as_tensor(value, dtype=ref.dtype, device=ref.device).expand_as(ref)
        out[name] = value.detach()[valid].cpu()
    return out


class ObservationRecorder:
    """Stands in for a `Calibrator` inside a worker: bounds from the real one, observations kept.

    Every attribute except `observe` is the wrapped calibrator's, so the loss clips with the
    bounds in force; `observe(...)` records the call (see `ShadowObservations`).
    """

    def __init__(self, calibrator: Any) -> None:
        self._calibrator = calibrator
        self.recorded = ShadowObservations()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._calibrator, name)

    @property
    def bounds(self) -> tuple[float, float]:
        """The wrapped calibrator's (L, H)."""
        return self._calibrator.bounds

    def observe(self, **kwargs: Any) -> None:
        """Record one micro-batch of statistics (same keywords as `Calibrator.observe`)."""
        if "fp8_ratio" not in kwargs:
            raise TypeError("observe() needs fp8_ratio=, bf16_ratio=, advantages= (keywords)")
        self.recorded.records.append(_compress(dict(kwargs)))
