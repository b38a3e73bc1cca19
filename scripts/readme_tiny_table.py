"""Regenerate the README's "What the embedded default shows" table from the three tiny runs.

    uv run nemo_fp8_rl.train --recipe recipes/tiny/grpo-tiny-qwen3-cpu-bf16.yaml
    uv run nemo_fp8_rl.train --recipe recipes/tiny/grpo-tiny-qwen3-cpu-fp8-uncalibrated.yaml
    uv run nemo_fp8_rl.train --recipe recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml
    uv run python scripts/readme_tiny_table.py [--runs runs] [--write README.md]
    uv run python scripts/readme_tiny_table.py --runs runs --archive kept-runs   # keep the data

Reads `runs/grpo-tiny-qwen3-cpu-{bf16,fp8-uncalibrated,fp8}` (metrics.jsonl and recipe.yaml;
an archive made by `--archive` holds metrics.jsonl.gz instead)
with `nemo_fp8_rl.analysis.rundata.load_run`, reduces them with `nemo_fp8_rl.analysis.compare.summarize_run` (the
`nemo_fp8_rl.compare` summary columns), adds the calibration and shadow-pass rows, and prints a
markdown block: the settings line (seed, steps, calibration schedule, read from the runs'
recipes), the table, and what it does not show. `--write` replaces the block between the
`<!-- tiny-table:begin -->` and `<!-- tiny-table:end -->` markers of that file (the README no
longer holds such a block: a single-seed table is not part of the committed results).

Every number is one run of one seed: there is no spread across seeds here.
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from nemo_fp8_rl.analysis.compare import RunSummary, summarize_run
from nemo_fp8_rl.analysis.rundata import RunData, Series, load_run
from nemo_fp8_rl.config.safe_files import write_atomic

VARIANTS = (
    ("bf16", "BF16"),
    ("fp8-uncalibrated", "FP8, nominal bounds"),
    ("fp8", "FP8, Calibrated Clipping"),
)
BEGIN, END = "<!-- tiny-table:begin -->", "<!-- tiny-table:end -->"
NONE = "—"


def _series(run: RunData, metric: str) -> Series | None:
    found = run.get(metric)
    return found.finite() if found is not None and len(found.finite()) else None


def _range(s: Series | None, fmt: str) -> str:
    """`lo–hi` of a series (one value when constant), `—` when not logged."""
    if s is None:
        return NONE
    lo, hi = float(np.min(s.values)), float(np.max(s.values))
    return (
        fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"
    )


def _mean_range(s: Series | None, fmt: str, unit: str = "") -> str:
    """`mean (lo–hi)` over the logged points, `—` when not logged."""
    if s is None:
        return NONE
    return f"{fmt.format(float(np.mean(s.values)))}{unit} ({_range(s, fmt)})"


def _at(run: RunData, metric: str, step: int) -> float:
    s = _series(run, metric)
    if s is None or step not in s.steps:
        return math.nan
    return float(s.values[int(np.searchsorted(s.steps, step))])


def accuracy_row(run: RunData, metric: str) -> str:
    """`step 0 → best (final)` of a validation metric."""
    s = _series(run, metric)
    if s is None:
        return NONE
    return f"{_at(run, metric, 0):.3f} → {np.max(s.values):.3f} ({s.values[-1]:.3f})"


def h_changes(run: RunData) -> str:
    """How many calibrations moved H (`calib_high_next` ≠ `calib_high`), out of how many ran.

    Calibration steps are those that log `calib_n_neg`; the bounds are logged on every step.
    """
    before, after = _series(run, "train/calib_high"), _series(run, "train/calib_high_next")
    calibrations = _series(run, "train/calib_n_neg")
    if after is None or before is None or calibrations is None:
        return NONE
    old = dict(zip(before.steps.tolist(), before.values.tolist(), strict=True))
    new = dict(zip(after.steps.tolist(), after.values.tolist(), strict=True))
    steps = calibrations.steps.tolist()
    moved = sum(abs(new[k] - old[k]) > 1e-9 for k in steps)
    return f"{moved} of {len(steps)}"


def h_target_at_cap(run: RunData) -> str:
    """Calibrations whose H* equals `high_max` (the cap)."""
    s = _series(run, "train/calib_high_target")
    if s is None:
        return NONE
    cap = run.config["loss_fn"]["calibration"]["high_max"]
    return f"{int(np.sum(np.isclose(s.values, cap)))} of {len(s)}"


def rows(runs: list[RunData], summaries: list[RunSummary]) -> list[tuple[str, list[str]]]:
    """(label, one cell per run) for every table row."""

    def each(fn) -> list[str]:
        return [fn(r, s) for r, s in zip(runs, summaries, strict=True)]

    def pct(key: str):
        return lambda r, s: f"{100 * s.values[key]:.2f} %"

    return [
        (
            "validation accuracy, greedy (256 problems), step 0 → best (final)",
            each(lambda r, s: accuracy_row(r, "validation/accuracy")),
        ),
        (
            "validation accuracy, sampled, step 0 → best (final)",
            each(lambda r, s: accuracy_row(r, "validation/accuracy_sampled")),
        ),
        ("reward, mean of the last 10 steps", each(lambda r, s: f"{s.values['reward']:.3f}")),
        ("entropy surge onset (`nemo_fp8_rl.compare`'s detector)", each(lambda r, s: _surge(s))),
        (
            "negative-advantage tokens clipped at the lower bound (mean share over steps)",
            each(pct("clip_low_neg")),
        ),
        (
            "clip bounds in force, L; H (range over steps)",
            each(
                lambda r, s: (
                    f"{_range(_series(r, 'train/calib_low'), '{:.2f}')}; "
                    f"{_range(_series(r, 'train/calib_high'), '{:.2f}')}"
                )
            ),
        ),
        ("calibrations that moved H; with H* at the cap", each(lambda r, s: _cap_cell(r))),
        (
            "m: BF16-clipped negative-advantage tokens per calibration window",
            each(lambda r, s: _range(_series(r, "train/calib_bf16_lower_count_neg"), "{:.0f}")),
        ),
        (
            "M: the same, pooled over the windows L* rests on (until ≥ m_min); windows pooled",
            each(
                lambda r, s: (
                    NONE
                    if _series(r, "train/calib_low_pool_clipped") is None
                    else f"{_range(_series(r, 'train/calib_low_pool_clipped'), '{:.0f}')}; "
                    f"{_range(_series(r, 'train/calib_low_pool_windows'), '{:.0f}')}"
                )
            ),
        ),
        (
            "negative-advantage tokens per calibration",
            each(lambda r, s: _range(_series(r, "train/calib_n_neg"), "{:.0f}")),
        ),
        (
            "width of the distribution-free 90 % interval of L*, per calibration",
            each(lambda r, s: _range(_series(r, "train/calib_low_target_ci90_width"), "{:.3f}")),
        ),
        (
            "`token_mult_prob_error` / `gen_kl_error` (mean over steps)",
            each(
                lambda r, s: (
                    f"{s.values['token_mult_prob_error']:.3f} / {s.values['gen_kl_error']:.1e}"
                )
            ),
        ),
        (
            "probability NMAE, FP8 vs BF16 shadow pass: mean (range)",
            each(lambda r, s: _pct_range(_series(r, "train/prob_nmae"))),
        ),
        (
            "ratio NMAE, FP8 vs BF16 shadow pass: mean (range)",
            each(lambda r, s: _pct_range(_series(r, "train/ratio_nmae"))),
        ),
        (
            "paper-style quotient = ratio NMAE ÷ probability NMAE (≈ 2 for one pass): mean (range)",
            each(lambda r, s: _mean_range(_series(r, "train/ratio_amplification"), "{:.2f}", "×")),
        ),
        (
            "**compounding** = ratio NMAE ÷ single-pass ratio error (√2 independent, 0 cancel)",
            each(lambda r, s: _mean_range(_series(r, "train/ratio_compounding"), "{:.2f}", "×")),
        ),
        (
            "per-token relative probability error ÷ probability NMAE (no ratio involved)",
            each(
                lambda r, s: _mean_range(
                    _series(r, "train/prob_relative_error_over_nmae"), "{:.2f}", "×"
                )
            ),
        ),
    ]


def _surge(summary: RunSummary) -> str:
    if "train/entropy" in summary.missing:
        return NONE
    return "none" if summary.surge_step is None else f"step {summary.surge_step}"


def _cap_cell(run: RunData) -> str:
    moved = h_changes(run)
    return NONE if moved == NONE else f"{moved}; {h_target_at_cap(run)}"


def _pct_range(s: Series | None) -> str:
    if s is None:
        return NONE
    return f"{100 * np.mean(s.values):.2f} % ({100 * np.min(s.values):.2f}–{100 * np.max(s.values):.2f} %)"


def _warmup_steps(run: RunData, cfg: dict) -> str:
    """Warm-up steps the run took (`warmup/steps` at step 0), else the configured fixed count."""
    logged = run.get("warmup/steps")
    if logged is not None and len(logged.values):
        return str(int(logged.values[0]))
    return str(cfg["local"]["warmup"]["steps"])


def settings_line(runs: list[RunData]) -> str:
    """Seeds and settings, read from the runs' resolved recipes."""
    cfg = runs[-1].config
    grpo, cal = cfg["grpo"], cfg["loss_fn"]["calibration"]
    seeds = sorted({r.config["grpo"]["seed"] for r in runs})
    samples = grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"]
    updates = samples // cfg["policy"]["train_global_batch_size"]
    warmup = _warmup_steps(runs[-1], cfg)
    return (
        f"One run per recipe, seed {', '.join(map(str, seeds))}: {grpo['max_num_steps']} GRPO "
        f"steps after a {warmup}-step supervised warm-up, {grpo['num_prompts_per_step']} prompts "
        f"× {grpo['num_generations_per_prompt']} samples per step, {updates} optimiser steps per "
        f"rollout batch. The tiny recipes calibrate every {cal['interval']} steps from ≥ "
        f"{cal['min_tokens']} tokens of each advantage sign (the method's default: every 20 "
        f"steps, ≥ 1,024 tokens); BF16 shadow passes run on the same schedule in the uncalibrated "
        f"FP8 run (diagnostics only). Calibration: m_min = {cal.get('min_clipped_tokens', NONE)}, "
        f"τ = {cal.get('rho_tolerance', NONE)}, β = {cal['smoothing']}, δ_L = {cal['max_step_low']}, "
        f"δ_H = {cal['max_step_high']}, H_max = {cal['high_max']}."
    )


def _load(folder: Path) -> RunData:
    """`load_run` of a run folder; a committed copy (metrics.jsonl.gz) is unpacked first."""
    packed = folder / "metrics.jsonl.gz"
    if not packed.exists():
        return load_run(folder)
    with tempfile.TemporaryDirectory() as tmp:
        write_atomic(Path(tmp) / "recipe.yaml", (folder / "recipe.yaml").read_bytes())
        write_atomic(Path(tmp) / "metrics.jsonl", gzip.decompress(packed.read_bytes()))
        return load_run(Path(tmp), name=folder.name)


def archive(run_root: Path, dest: Path) -> None:
    """Copy what the table reads (recipe.yaml, metrics as reproducible gzip) into `dest`."""
    for v, _ in VARIANTS:
        src, out = run_root / f"grpo-tiny-qwen3-cpu-{v}", dest / f"grpo-tiny-qwen3-cpu-{v}"
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "recipe.yaml", (src / "recipe.yaml").read_bytes())
        data = (src / "metrics.jsonl").read_bytes()
        write_atomic(out / "metrics.jsonl.gz", gzip.compress(data, mtime=0))


def render(run_root: Path) -> str:
    """The markdown block: settings, table, regeneration command."""
    runs = [_load(run_root / f"grpo-tiny-qwen3-cpu-{v}") for v, _ in VARIANTS]
    for run in runs:
        incomplete = [n for n in run.notes if "incomplete" in n]
        if incomplete:
            raise SystemExit(f"error: {incomplete[0]}; finish the run before regenerating")
    summaries = [summarize_run(r) for r in runs]
    lines = [
        settings_line(runs),
        "",
        "| | " + " | ".join(label for _, label in VARIANTS) + " |",
        "|---|" + "---|" * len(VARIANTS),
    ]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows(runs, summaries)]
    lines += [
        "",
        "Generated by `uv run python scripts/readme_tiny_table.py --runs <folder>` from the three "
        "runs above (`--archive <folder> <dest>` keeps what it reads); a dash means the run does "
        "not log the metric (the BF16 run has no shadow pass, only the calibrated run has a "
        "calibrator).",
    ]
    return "\n".join(lines)


def write_block(path: Path, block: str) -> None:
    """Replace the text between the markers in `path` (which must hold both, once)."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"error: {path} must contain {BEGIN} … {END} exactly once")
    write_atomic(path, pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text))


def missing_runs(run_root: Path) -> list[str]:
    """The variants whose run folder (with its metrics, plain or packed) is not in `run_root`."""
    return [
        v
        for v, _ in VARIANTS
        if not any(
            (run_root / f"grpo-tiny-qwen3-cpu-{v}" / name).is_file()
            for name in ("metrics.jsonl", "metrics.jsonl.gz")
        )
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the block, or write it into a file between the markers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="folder of the run dirs")
    parser.add_argument("--write", type=Path, help="file whose marked block is replaced")
    parser.add_argument("--archive", type=Path, help="copy the runs' data into this folder")
    args = parser.parse_args(argv)
    missing = missing_runs(args.runs)
    if missing:
        v = missing[0]
        print(
            f"error: {args.runs / f'grpo-tiny-qwen3-cpu-{v}'}: no such run (the table needs "
            f"all {len(VARIANTS)}; missing: {', '.join(missing)}). Fix: train it with `uv run "
            f"nemo_fp8_rl.train --recipe tiny/grpo-tiny-qwen3-cpu-{v}`, or pass --runs with the "
            "folder holding the runs",
            file=sys.stderr,
        )
        return 2
    if args.archive:
        archive(args.runs, args.archive)
        return 0
    block = render(args.runs)
    if args.write:
        write_block(args.write, block)
    else:
        sys.stdout.write(block + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
