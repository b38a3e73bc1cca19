"""Tables, comparisons, verdict and figure of the 4-bit rescue study, from its archived runs.

Per run, the dose study's summary (`dose_report.summarize`). Comparisons on the primary
endpoint (`val_gain`), as pre-registered in `endpoints.yaml` (`rescue:`), each over the seeds all
its arms have: the per-seed differences, their mean with the Student-t 95 % interval and the
two-sided paired t-test p (`significance.paired_test`):

    ceiling[f]  = f-noclip − f-uncalibrated       control = bf16-noclip − bf16
    mediation[f] = (f-noclip − f-uncalibrated) − (bf16-noclip − bf16)
    noclip_loss[f] = f-noclip − bf16-noclip        unfloored[f] = f-unfloored − f-uncalibrated
    fix[a] = a − f-uncalibrated                    (each (c)/(d) arm a of format f)

The decision family (mediation, unfloored, fix) is Holm-adjusted (`significance.holm`). The
intervals are not adjusted; the decisions are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.study import endpoints
from nemo_fp8_rl.study.dose_report import summarize
from nemo_fp8_rl.study.rescue import ARCHIVE, run_name
from nemo_fp8_rl.study.significance import holm, paired_test

PRIMARY = "val_gain"


def arms() -> list[str]:
    """Every arm of the design, reference arms first, then the phases in order."""
    design = endpoints.load().rescue
    out = list(design.reference_arms)
    for phase in design.phases:
        out += [a for a in phase if a not in out]
    return out


def collect(archive: Path = ARCHIVE) -> dict[str, dict[int, dict]]:
    """`{arm: {seed: summary}}` of the archived runs (arms without runs left out)."""
    threshold = endpoints.load().dose.entropy_surge.threshold
    out: dict[str, dict[int, dict]] = {}
    for arm in arms():
        runs = sorted((archive / run_name(arm)).glob("seed-*"))
        if runs:
            out[arm] = {int(r.name[5:]): summarize(r, threshold) for r in runs}
    return out


@dataclass(frozen=True)
class Comparison:
    """One pre-registered comparison: its name, formula, the interval and p of its per-seed
    values, whether it is in the Holm family, and (once adjusted) its Holm p."""

    name: str
    formula: str
    interval: stats.Interval
    p: float
    family: bool
    holm_p: float = math.nan


def _values(table: dict[str, dict[int, dict]], arm: str) -> dict[int, float]:
    return {s: v.get(PRIMARY, math.nan) for s, v in table.get(arm, {}).items()}


def _diff(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    seeds = [s for s in a if s in b and math.isfinite(a[s]) and math.isfinite(b[s])]
    return {s: a[s] - b[s] for s in sorted(seeds)}


def _make(name: str, formula: str, values: dict[int, float], family: bool) -> Comparison:
    iv, p = paired_test(values)
    return Comparison(name, formula, iv, p, family)


def comparisons(table: dict[str, dict[int, dict]]) -> list[Comparison]:
    """Every pre-registered comparison whose arms have runs, Holm-adjusted (module doc)."""
    v = {arm: _values(table, arm) for arm in table}
    out = []
    control = _diff(v.get("bf16-noclip", {}), v.get("bf16", {}))
    if control:
        out.append(_make("control", "bf16-noclip − bf16", control, False))
    for f in endpoints.load().rescue.formats:
        unc = v.get(f"{f}-uncalibrated", {})
        ceiling = _diff(v.get(f"{f}-noclip", {}), unc)
        if ceiling:
            out.append(_make(f"ceiling[{f}]", f"{f}-noclip − {f}-uncalibrated", ceiling, False))
        if ceiling and control:
            did = _diff(ceiling, control)
            out.append(_make(f"mediation[{f}]", f"ceiling[{f}] − control", did, True))
        noclip_loss = _diff(v.get(f"{f}-noclip", {}), v.get("bf16-noclip", {}))
        if noclip_loss:
            out.append(_make(f"noclip_loss[{f}]", f"{f}-noclip − bf16-noclip", noclip_loss, False))
        for arm in sorted(a for a in v if a.startswith(f"{f}-") and a != f"{f}-uncalibrated"):
            if arm == f"{f}-noclip":
                continue
            d = _diff(v[arm], unc)
            if d:
                kind = "unfloored" if arm == f"{f}-unfloored" else "fix"
                name = f"unfloored[{f}]" if kind == "unfloored" else f"fix[{arm}]"
                out.append(_make(name, f"{arm} − {f}-uncalibrated", d, True))
    return holm_family(out)


def holm_family(comps: list[Comparison]) -> list[Comparison]:
    """The comparisons with `holm_p` set on the family members (`significance.holm`)."""
    fam = [i for i, c in enumerate(comps) if c.family]
    adjusted = dict(zip(fam, holm([comps[i].p for i in fam]), strict=True))
    return [
        Comparison(c.name, c.formula, c.interval, c.p, c.family, adjusted.get(i, math.nan))
        for i, c in enumerate(comps)
    ]


def _fmt(iv: stats.Interval, spec: str = "{:+.3f}") -> str:
    return stats.format_interval(iv, spec)


def verdict(comps: list[Comparison]) -> str:
    """The pre-registered verdict, one sentence per decision comparison, and what is missing."""
    alpha = endpoints.load().rescue.alpha
    lines = []
    for c in comps:
        if not c.family:
            continue
        shown = c.interval.estimate > 0 and c.holm_p < alpha
        what = (
            "the 4-bit loss is clip-mediated"
            if c.name.startswith("mediation")
            else "it gives accuracy back"
        )
        if not math.isfinite(c.holm_p):
            lines.append(f"- {c.name}: no test yet ({_fmt(c.interval)}: one paired seed).")
        elif shown:
            lines.append(f"- {c.name}: {what} ({_fmt(c.interval)}, Holm p {c.holm_p:.3f}).")
        else:
            up = c.interval.high
            bound = f"; the runs still allow at most {up:+.3f}" if math.isfinite(up) else ""
            lines.append(
                f"- {c.name}: not shown ({_fmt(c.interval)}, Holm p {c.holm_p:.3f}){bound}."
            )
    return "\n".join(lines) if lines else "- no decision comparison has two paired seeds yet."


def interim(table: dict[str, dict[int, dict]]) -> bool:
    """True while some arm of the design lacks a seed: the rule's verdict is not yet made."""
    seeds = set(endpoints.load().rescue.seeds)
    return any(seeds - set(table.get(arm, {})) for arm in arms())


def comparison_table(comps: list[Comparison]) -> str:
    """Every comparison: formula, paired interval (n), p, Holm p (family members only)."""
    lines = [
        "| comparison | formula | accuracy gain difference (95 % t, n) | p | Holm p |",
        "|---|---|---|---|---|",
    ]
    for c in comps:
        holm_p = f"{c.holm_p:.3f}" if c.family and math.isfinite(c.holm_p) else "—"
        p = f"{c.p:.3f}" if math.isfinite(c.p) else "—"
        lines.append(f"| {c.name} | {c.formula} | {_fmt(c.interval)} | {p} | {holm_p} |")
    return "\n".join(lines)


def missing(table: dict[str, dict[int, dict]]) -> str:
    """Arms of the design and the seeds they lack (the study's progress)."""
    seeds = set(endpoints.load().rescue.seeds)
    rows = []
    for arm in arms():
        lack = sorted(seeds - set(table.get(arm, {})))
        if lack:
            rows.append(f"{arm} (seeds {', '.join(map(str, lack))})")
    return "Not run yet: " + "; ".join(rows) + "." if rows else "Every arm has every seed."


def markdown(archive: Path = ARCHIVE) -> str:
    """Per-arm table, comparisons, verdict and what is missing, from the archive."""
    from nemo_fp8_rl.study.dose_report import arm_table

    table = collect(archive)
    comps = comparisons(table)
    return "\n\n".join(
        [
            "Per arm (mean [95 % Student-t interval] (n seeds)):",
            arm_table(table),
            "Comparisons of the primary endpoint (accuracy gain from step 0, BF16-scored), "
            "paired by seed; intervals unadjusted, the decision family Holm-adjusted:",
            comparison_table(comps),
            "Interim reading by the pre-registered rule (the design is incomplete: the verdict "
            "is the one made with every seed, and the Holm family grows with the arms run):"
            if interim(table)
            else "Verdict by the pre-registered rule:",
            verdict(comps),
            missing(table),
        ]
    )


def figure(archive: Path = ARCHIVE, out: Path | None = None) -> Path:
    """The comparisons' paired differences with their 95 % t-intervals (one row each); the
    PNG's path (`docs/study/rescue/rescue_comparisons.png` by default)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nemo_fp8_rl.config.safe_files import write_atomic_with
    from nemo_fp8_rl.study.rescue import DOCS

    comps = comparisons(collect(archive))
    path = (out or DOCS) / "rescue_comparisons.png"
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(comps), 2) + 1.2))
    for row, c in enumerate(comps):
        iv = c.interval
        err = [[iv.estimate - iv.low], [iv.high - iv.estimate]] if iv.has_interval else None
        ax.errorbar([iv.estimate], [row], xerr=err, fmt="o" if c.family else "s", capsize=3)
    ax.axvline(0.0, color="grey", lw=0.8)
    ax.set_yticks(range(len(comps)), [f"{c.name} (n={c.interval.n})" for c in comps], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("difference in accuracy gain from step 0 (BF16-scored), paired by seed")
    ax.set_title("Rescue study: o decision family (Holm), s descriptive; 95 % t-intervals")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_with(path, lambda f: fig.savefig(f, format="png", dpi=110))  # safe-write: fd
    plt.close(fig)
    return path
