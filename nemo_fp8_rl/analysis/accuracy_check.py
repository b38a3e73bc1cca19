"""Which runs' accuracy a verdict may read: a run that logged a NaN or infinite accuracy is left
out of the accuracy comparison, with the reason printed; the verdict never switches metric
because of it.

An accuracy is a fraction in [0, 1]; a NaN or an infinity in it is a broken run or a broken
log, not a score. Before this check, one such value made every step "not common to all runs",
and the verdict quietly fell back to the training reward for the whole comparison (so one bad
seed could turn a real accuracy gap into "within noise"). Now the run is excluded from the
accuracy comparison (the other seeds keep it on validation accuracy; n drops by one and says
so), and the note names the run, its metrics file, the metric and the steps. The training
reward is compared only when no run logged the accuracy metric at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nemo_fp8_rl.analysis.rundata import RunData
from nemo_fp8_rl.config.user_error import render

SHOWN = 3  # bad points named in a note


def nonfinite_reason(run: RunData, metric: str) -> str | None:
    """Why `run`'s `metric` cannot be compared (its NaN or infinite points), or None."""
    series, found = run.find(metric)
    if series is None:
        return None
    bad = np.flatnonzero(~np.isfinite(series.values))
    if not bad.size:
        return None
    shown = ", ".join(
        f"{float(series.values[i])} at step {int(series.steps[i])}" for i in bad[:SHOWN]
    )
    more = f" and {bad.size - SHOWN} more" if bad.size > SHOWN else ""
    return render(
        f"{run.name} ({run.path})",
        f"{found} is {shown}{more}, not an accuracy in [0, 1]; this run is left out of the "
        "accuracy comparison, which goes on over the other runs without switching metric",
        "repair or rerun that run's validation",
    )


def excluded_runs(runs: Sequence[RunData], metric: str) -> dict[int, str]:
    """Index -> reason for every run whose `metric` holds a NaN or an infinity."""
    out = {}
    for i, run in enumerate(runs):
        reason = nonfinite_reason(run, metric)
        if reason is not None:
            out[i] = reason
    return out


def not_comparable(runs: Sequence[RunData], metric: str) -> str | None:
    """For a comparison of two runs: why their accuracy cannot be compared (one of them holds
    a NaN or an infinity), or None."""
    bad = excluded_runs(runs, metric)
    if not bad:
        return None
    names = ", ".join(runs[i].name for i in sorted(bad))
    return f"accuracy not comparable ({names}: {metric} NaN or infinite, see the notes)"
