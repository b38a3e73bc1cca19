"""What one embedded-engine run shows, in a few lines printed after its closing summary.

From the run's metric records: the clip shares by advantage sign under the bounds in force,
against the nominal bounds 1 ± ε; on the BF16 shadow steps (FP8 training), the shares of A<0
tokens whose FP8 and BF16 ratios fall below the nominal lower bound, same tokens, and the
compounding (ratio error ÷ single-pass error: 0 cancel, 1 one pass, √2 independent); the entropy
trend (first and last 5 steps), surge onsets by `compare`'s rule, and the study's largest-rise
statistic (`endpoints.yaml`) as a number, not a verdict. It ends with what one run cannot show and where the measurement over seeds is.
"""

from __future__ import annotations

import math

from nemo_fp8_rl.study import endpoints


def _values(records: list[dict], key: str) -> list[float]:
    return [
        float(r[key])
        for r in records
        if r.get("step", 0) >= 1 and isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _clip_line(records: list[dict], eps_low: float, eps_high: float) -> str | None:
    low, high = (
        _values(records, "train/clip_lower_frac_neg"),
        _values(records, "train/clip_upper_frac_pos"),
    )
    if not low:
        return None
    bounds = _values(records, "train/calib_low")
    where = (
        f"L moved {bounds[0]:.3f} -> {bounds[-1]:.3f}"
        if bounds and abs(bounds[0] - bounds[-1]) > 5e-4
        else f"the nominal bounds {1 - eps_low:.2f}, {1 + eps_high:.2f}"
    )
    return (
        f"  clipped under the bounds in force ({where}): A<0 below L {100 * _mean(low):.2f} %, "
        f"A>0 above H {100 * _mean(high):.2f} % (mean over steps)"
    )


def _shadow_lines(records: list[dict], eps_low: float) -> list[str]:
    fp8 = _values(records, "train/fp8_nominal_lower_frac_neg")
    bf16 = _values(records, "train/bf16_lower_frac_neg")
    if not fp8:
        return []
    lines = [
        f"  shadow steps, same A<0 tokens below the nominal {1 - eps_low:.2f}: FP8 ratio "
        f"{100 * _mean(fp8):.2f} %, BF16 ratio {100 * _mean(bf16):.2f} %"
        + (f" ({_mean(fp8) / _mean(bf16):.1f}x)" if _mean(bf16) > 0 else "")
    ]
    ratio = sum(_values(records, "train/ratio_nmae"))
    single = sum(_values(records, "train/single_pass_nmae"))
    if single > 0:
        lines.append(
            f"  compounding (ratio error / one FP8 pass's error): {ratio / single:.2f} "
            "(0 cancel, 1 one pass, 1.41 independent)"
        )
    return lines


def _entropy_line(records: list[dict]) -> str | None:
    """The entropy trend, surge onsets by `compare`'s rule (`analysis.surge`, one definition of
    a surge for a run), and the study's endpoint statistic, named as such and not judged: its
    threshold is set over seeds, and one run's value against it says nothing."""
    from nemo_fp8_rl.analysis.surge import RULE, detect_entropy_surges

    steps = [
        int(r["step"])
        for r in records
        if r.get("step", 0) >= 1
        and isinstance(r.get("train/entropy"), int | float)
        and math.isfinite(r["train/entropy"])
    ]
    ent = _values(records, "train/entropy")
    if len(ent) < 2:
        return None
    onsets = detect_entropy_surges(steps, ent)
    surges = f"steps {', '.join(map(str, onsets))}" if onsets else "none"
    window = endpoints.load().entropy_surge.window
    rise = endpoints.largest_rise(ent, window)
    return (
        f"  entropy {_mean(ent[:5]):.3f} -> {_mean(ent[-5:]):.3f} (first / last 5 steps); "
        f"entropy surge onsets ({RULE}): {surges}; largest rise above the trailing "
        f"{window}-step minimum {rise:.3f} nats (the study's endpoint, compared over seeds)"
    )


def run_note(records: list[dict], eps_low: float = 0.2, eps_high: float = 0.2) -> list[str]:
    """The lines (empty when the run logged no training step)."""
    facts = [_clip_line(records, eps_low, eps_high), *_shadow_lines(records, eps_low)]
    facts.append(_entropy_line(records))
    facts = [f for f in facts if f]
    if not facts:
        return []
    return [
        "what this run shows:",
        *facts,
        "  one run is one seed: differences from another recipe's run are not evidence; the "
        "measurement over seeds, and what it does not show, is docs/study/README.md "
        "(python -m nemo_fp8_rl.study)",
    ]
