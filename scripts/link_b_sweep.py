"""Link-B sweep: BF16 study runs with the negative-gradient drop q (never FP8), and its table.

Each q is the BF16 study recipe (`recipes/study/grpo-study-bf16.yaml`) plus the labelled overlay
`configs/ablation/negative-gradient-drop.yaml` with `loss_fn.ablation.negative_gradient_drop_q=q`:
a random share q of the negative-advantage tokens get the lower clip's zero gradient. q = 0 is the
unmodified BF16 recipe, whose runs are the committed study runs (`docs/study/runs/grpo-study-bf16`;
q = 0 draws nothing, so it is that recipe exactly). The "FP8 dose" is FP8's measured extra share of
lower-clipped A<0 tokens: mean over the committed seeds of FP8-uncalibrated − BF16
`clip_lower_frac_neg`.

    python scripts/link_b_sweep.py run --q 1.0,dose --seeds 1-3,5-6 --out runs/link-b
    python scripts/link_b_sweep.py archive --out runs/link-b     # -> docs/study/link-b/runs
    python scripts/link_b_sweep.py table                          # endpoints per q, from the archive
    python scripts/link_b_sweep.py rerun --q 0 --seeds 1-3,5-6 --out runs/link-b-rerun
                                                                  # reruns, compared bit for bit

The setting search (`--setting NAME`, an overlay in configs/ablation/link-b-settings/) runs the
same drop in another setting, q = 0 included (its own runs, not the study's):

    python scripts/link_b_sweep.py run --setting lr-x5 --q 0,1 --seeds 1-3 --out runs/link-b
    python scripts/link_b_sweep.py archive --setting lr-x5 --out runs/link-b
    python scripts/link_b_sweep.py table --setting lr-x5

Runs go `--jobs` at a time (default 1); per-step metrics of finished runs are archived gzip-compressed.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_fp8_rl.config.safe_files import write_atomic  # noqa: E402
from nemo_fp8_rl.runs.seeds import parse_seeds  # noqa: E402
from nemo_fp8_rl.study import analysis, grid  # noqa: E402

BASE = ROOT / "recipes" / "study" / "grpo-study-bf16.yaml"
OVERLAY = ROOT / "configs" / "ablation" / "negative-gradient-drop.yaml"
STUDY_RUNS = ROOT / "docs" / "study" / "runs"
ARCHIVE = ROOT / "docs" / "study" / "link-b" / "runs"
PREFIX = "grpo-study-bf16-negdrop-q"
SETTINGS = ROOT / "configs" / "ablation" / "link-b-settings"
SETTINGS_ARCHIVE = ROOT / "docs" / "study" / "link-b" / "settings"


def prefix(setting: str | None) -> str:
    """Run-name prefix: the study's drop runs, or `<setting>-` before it."""
    return PREFIX if setting is None else f"{setting}-{PREFIX}"


def archive_of(setting: str | None) -> Path:
    return ARCHIVE if setting is None else SETTINGS_ARCHIVE / setting / "runs"


def fp8_dose(runs: Path = STUDY_RUNS) -> float:
    """FP8's extra share of lower-clipped A<0 tokens over BF16 (mean over committed seeds)."""
    seeds = sorted(int(p.name.split("-")[1]) for p in (runs / "grpo-study-bf16").glob("seed-*"))
    table = analysis.collect(runs, ["grpo-study-bf16", "grpo-study-fp8-uncalibrated"], seeds)
    b = analysis.column(table, "grpo-study-bf16", "clip_lower_frac_neg")
    u = analysis.column(table, "grpo-study-fp8-uncalibrated", "clip_lower_frac_neg")
    both = sorted(set(b) & set(u))
    return sum(u[s] - b[s] for s in both) / len(both)


def q_values(text: str) -> list[float]:
    """`1.0,dose,0.3` -> floats; `dose` is `fp8_dose()` rounded to 3 decimals."""
    return [round(fp8_dose(), 3) if t == "dose" else float(t) for t in text.split(",")]


def recipe_for(q: float, folder: Path, setting: str | None = None) -> Path:
    """A recipe file: the BF16 study recipe (plus a setting overlay) and the drop at share q."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix(setting)}{q:g}.yaml"
    extra = "" if setting is None else f"  - {SETTINGS / (setting + '.yaml')}\n"
    write_atomic(
        path,
        f"# Link-B ablation (not FP8): BF16 study recipe, negative-gradient drop q = {q:g}"
        f"{'' if setting is None else ', setting ' + setting}\n"
        f"defaults:\n  - {BASE}\n{extra}  - {OVERLAY}\n"
        f"loss_fn:\n  ablation:\n    negative_gradient_drop_q: {q!r}\n",
    )
    return path


def run(
    qs: list[float], seeds: list[int], out: Path, jobs: int = 1, setting: str | None = None
) -> int:
    """Run every (q, seed), q-major, `jobs` at a time; returns the number of failed runs."""
    recipes = [recipe_for(q, out / "recipes", setting) for q in qs]
    specs = grid.plan(recipes, seeds, out)
    for spec in specs:
        grid.action(spec)
    results = grid.run_all(specs, jobs=jobs)
    return sum(r.returncode != 0 for r in results)


def archive(out: Path, setting: str | None = None) -> list[Path]:
    """Copy the finished runs' metrics (gzip) to the setting's archive; returns what was written."""
    dest, written = archive_of(setting), []
    for metrics in sorted(out.glob(f"{prefix(setting)}[0-9]*/seed-*/metrics.jsonl")):
        run_dir = metrics.parent
        records = analysis.read_records(run_dir)
        steps = max(r["step"] for r in records)
        planned = yaml.safe_load((run_dir / "recipe.yaml").read_text())["grpo"]["max_num_steps"]
        if steps < planned:
            print(f"skipped  {run_dir.parent.name}/{run_dir.name} (step {steps} of {planned})")
            continue
        target = dest / run_dir.parent.name / run_dir.name
        target.mkdir(parents=True, exist_ok=True)
        packed = io.BytesIO()  # the gzip header names metrics.jsonl, as before
        with gzip.GzipFile(
            str(target / "metrics.jsonl.gz"), "wb", 9, packed, mtime=0
        ) as f:  # safe-write: buffer
            f.write(metrics.read_bytes())
        write_atomic(target / "metrics.jsonl.gz", packed.getvalue())
        written.append(target)
        print(f"archived {run_dir.parent.name}/{run_dir.name} ({steps} steps)")
    return written


# Keys that measure the machine, not the run: left out of the bit-for-bit comparison.
MACHINE_KEYS = ("timing/", "throughput/", "system/")


def committed_run(q: float, seed: int, setting: str | None = None) -> Path:
    """The archived run of (q, seed): q = 0 of the study is the committed BF16 study run."""
    if setting is None and q == 0:
        return STUDY_RUNS / "grpo-study-bf16" / f"seed-{seed}"
    return archive_of(setting) / f"{prefix(setting)}{q:g}" / f"seed-{seed}"


def differences(committed: list[dict], rerun: list[dict]) -> list[str]:
    """Where a rerun's metric records differ from the committed ones: every key the committed
    record holds, except `MACHINE_KEYS`, must have the same value bit for bit (keys the engine
    logs since, such as `validation/bf16_accuracy`, are not compared)."""
    found = []
    if len(committed) != len(rerun):
        found.append(f"{len(committed)} records committed, {len(rerun)} rerun")
    for old, new in zip(committed, rerun, strict=False):
        for key, value in old.items():
            if key.startswith(MACHINE_KEYS):
                continue
            if key not in new or new[key] != value:
                found.append(
                    f"step {old.get('step')}: {key} {value!r} vs {new.get(key, 'absent')!r}"
                )
    return found


def rerun(qs: list[float], seeds: list[int], out: Path, jobs: int = 1) -> int:
    """Run each (q, seed) again and compare its records with the archived run bit for bit;
    prints one line per run and returns the number that differ (or failed)."""
    failed = run(qs, seeds, out, jobs)
    differing = 0
    for q in qs:
        for seed in seeds:
            new = out / f"{PREFIX}{q:g}" / f"seed-{seed}"
            old = committed_run(q, seed)
            diffs = differences(analysis.read_records(old), analysis.read_records(new))
            differing += bool(diffs)
            what = "identical" if not diffs else f"DIFFERS ({len(diffs)}; first: {diffs[0]})"
            print(f"q={q:g} seed {seed}: {what} to {old.relative_to(ROOT)}")
    return differing + failed


ENDPOINTS = (
    ("val_mean", "accuracy, mean after step 0"),
    ("val_gain", "gain from step 0"),
    ("entropy_rise", "largest entropy rise"),
    ("entropy_mean", "mean entropy"),
)


def collect(setting: str | None = None) -> dict[float, dict[int, dict]]:
    """`{q: {seed: summary}}`: for the study, q = 0 from the committed BF16 study runs; in a
    setting, every q from its own archived runs."""
    out: dict[float, dict[int, dict]] = {}
    if setting is None:
        base = STUDY_RUNS / "grpo-study-bf16"
        out[0.0] = {int(d.name[5:]): analysis.summarize(d) for d in sorted(base.glob("seed-*"))}
    head = prefix(setting)
    for folder in sorted(archive_of(setting).glob(f"{head}[0-9]*")):
        q = float(folder.name[len(head) :])
        out[q] = {int(d.name[5:]): analysis.summarize(d) for d in sorted(folder.glob("seed-*"))}
    return out


def slope(per_q: dict[float, dict[int, dict]], key: str) -> analysis.Interval:
    """Per seed, the least-squares slope of `key` in q over the q values that seed has (two at
    least); mean over seeds with its Student-t interval."""
    seeds = sorted({s for runs in per_q.values() for s in runs})
    slopes = []
    for seed in seeds:
        pts = [(q, runs[seed][key]) for q, runs in per_q.items() if seed in runs]
        if len(pts) < 2:
            continue
        mq = sum(q for q, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((q - mq) ** 2 for q, _ in pts)
        slopes.append(sum((q - mq) * (y - my) for q, y in pts) / sxx)
    return analysis.mean_interval(slopes)


def markdown(setting: str | None = None) -> str:
    """Per q: seeds, measured drop share, each endpoint's mean; then each endpoint's slope in q."""
    per_q = collect(setting)
    head = " | ".join(label for _, label in ENDPOINTS)
    lines = [
        f"| q | seeds | measured drop share of A<0 | {head} |",
        "|---|---|---|" + "---|" * len(ENDPOINTS),
    ]
    for q in sorted(per_q):
        runs = per_q[q]
        drop = analysis.mean_interval([s.get("neg_grad_drop_frac_neg", 0.0) for s in runs.values()])
        cells = " | ".join(
            analysis.mean_interval([s[k] for s in runs.values()]).fmt() for k, _ in ENDPOINTS
        )
        seeds = ", ".join(map(str, sorted(runs)))
        lines.append(f"| {q:g} | {seeds} | {drop.fmt('{:.4f}')} | {cells} |")
    lines += [
        "",
        "| endpoint | slope in q (per seed, least squares; mean over seeds) |",
        "|---|---|",
    ]
    for key, label in ENDPOINTS:
        lines.append(f"| {label} | {slope(per_q, key).fmt()} |")
    return "\n".join(lines)


SETTINGS_BEGIN, SETTINGS_END = "<!-- link-b-settings:begin -->", "<!-- link-b-settings:end -->"


def settings_markdown() -> str:
    """One table per archived setting of the search (its overlay named), in name order."""
    parts = []
    for folder in sorted(SETTINGS_ARCHIVE.glob("*/runs")):
        name = folder.parent.name
        parts.append(f"Setting `{name}` (configs/ablation/link-b-settings/{name}.yaml):\n")
        parts.append(markdown(name) + "\n")
    return "\n".join(parts).strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["run", "rerun", "archive", "table", "settings", "dose"])
    ap.add_argument("--q", default="1.0,dose,0.3,0.1")
    ap.add_argument("--seeds", default="1-3,5-6")
    ap.add_argument("--out", type=Path, default=Path("runs/link-b"))
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses one thread)")
    ap.add_argument("--setting", help="a setting of the search (configs/ablation/link-b-settings)")
    args = ap.parse_args(argv)
    if args.what == "dose":
        print(f"{fp8_dose():.4f}")
        return 0
    if args.what == "run":
        failed = run(q_values(args.q), parse_seeds(args.seeds), args.out, args.jobs, args.setting)
        return 1 if failed else 0
    if args.what == "rerun":
        return 1 if rerun(q_values(args.q), parse_seeds(args.seeds), args.out, args.jobs) else 0
    if args.what == "archive":
        archive(args.out, args.setting)
        return 0
    if args.what == "settings":
        print(settings_markdown())
        return 0
    print(markdown(args.setting))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
