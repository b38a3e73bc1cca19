"""Entropy-surge detection, online (during training) and offline (over logged metrics).

The one rule a run's entropy surge is called by (a rolling z-score, `RULE`): `compare`, its
report and the note at the end of an embedded run. The CPU studies' entropy endpoint is another
statistic, named as such ("largest entropy rise" above the trailing minimum, judged over seeds
against the study's own threshold, `study/endpoints.yaml`); the two measure different things and
can disagree, so each output names its rule.

Standard library only, so the comparison tool can use it without importing torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class EntropySurgeDetector:
    """Online entropy-surge detector: rolling z-score with a minimum absolute rise.

    Rule: at each step, with μ, σ the mean and standard deviation of the previous `window`
    values, the step is *flagged* if `(x − μ) / max(σ, min_std) ≥ z_threshold` and
    `x − μ ≥ min_rise`, once at least `min_history` values are known. A surge *onset* is a
    flagged step whose previous step was not flagged. Non-finite values are ignored. Flagged
    values enter the window, so a lasting shift becomes the new baseline.
    """

    window: int = 20
    z_threshold: float = 3.0
    min_rise: float = 0.05
    min_history: int = 5
    min_std: float = 1e-3
    _values: deque = field(default_factory=deque, repr=False)
    _last_flagged: bool = field(default=False, repr=False)
    onsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.window < 2 or self.min_history < 2 or self.min_history > self.window:
            raise ValueError(
                f"EntropySurgeDetector: need 2 ≤ min_history ≤ window, got {self.min_history}, {self.window}"
            )
        self._values = deque(maxlen=self.window)

    def update(self, step: int, entropy: float) -> bool:
        """Feed one step's entropy; True when this step is a surge onset."""
        if not math.isfinite(entropy):
            return False
        flagged = False
        if len(self._values) >= self.min_history:
            mu = math.fsum(self._values) / len(self._values)
            sd = math.sqrt(math.fsum((x - mu) ** 2 for x in self._values) / len(self._values))
            rise = entropy - mu
            flagged = rise >= self.min_rise and rise / max(sd, self.min_std) >= self.z_threshold
        self._values.append(entropy)
        onset = flagged and not self._last_flagged
        self._last_flagged = flagged
        if onset:
            self.onsets.append(step)
        return onset


def detect_entropy_surges(
    steps: Iterable[int], entropies: Iterable[float], **rule: float
) -> list[int]:
    """Offline: run `EntropySurgeDetector(**rule)` over a logged series; returns onset steps."""
    det = EntropySurgeDetector(**rule)
    for step, value in zip(steps, entropies, strict=True):
        det.update(int(step), float(value))
    return list(det.onsets)


def rule_text(det: EntropySurgeDetector | None = None) -> str:
    """The detector's rule in words, for every output that reports its surges."""
    d = det or EntropySurgeDetector()
    return (
        f"z-score detector: entropy ≥ {d.z_threshold:g} SD and ≥ {d.min_rise:g} nats above the "
        f"mean of the previous {d.window} steps"
    )


RULE = rule_text()
