"""The closing summary of a finished run: what changed, where the outputs are, what to run next.

Read from the run directory's `metrics.jsonl` (both engines write it, with NeMo RL's metric
names), so it says what the files say: validation accuracy at the first and last validation (the BF16-generation score where the
run logs it, `runs.scores`),
the mean clip shares by advantage sign and bound over the run, the calibrated clip bounds at
the start and the end, and the commands that evaluate, compare and chart the run.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from nemo_fp8_rl.config.commands import command, tool
from nemo_fp8_rl.runs.scores import accuracy_key, accuracy_label

# (what the line calls it, metric) of the clip shares, by advantage sign and bound
CLIP_SHARES = (
    ("A<0 tokens below the lower bound", "train/clip_lower_frac_neg"),
    ("A>0 tokens above the upper bound", "train/clip_upper_frac_pos"),
    ("all tokens at the lower bound", "train/clip_lower_frac"),
    ("all tokens at the upper bound", "train/clip_upper_frac"),
)


def read_records(run_dir: Path) -> list[dict]:
    """The records of `metrics.jsonl` that parse (an unreadable line is left out)."""
    path = run_dir / "metrics.jsonl"
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _series(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [
        (int(r.get("step", 0)), float(r[key]))
        for r in records
        if isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]


def summary_lines(run_dir: Path, records: list[dict]) -> list[str]:
    """The summary, one line per fact; facts the run did not log are left out."""
    lines = [f"summary of {run_dir}:"]
    key = accuracy_key(records)
    acc = _series(records, key)
    if acc:
        (s0, a0), (s1, a1) = acc[0], acc[-1]
        lines.append(
            f"  validation accuracy ({accuracy_label(key)}) {a0:.3f} (step {s0}) -> {a1:.3f} "
            f"(step {s1})"
        )
    shares = []
    for label, key in CLIP_SHARES:
        values = [v for _, v in _series(records, key)]
        if values:
            shares.append(f"{label} {100 * sum(values) / len(values):.2f} %")
    if shares:
        lines.append("  clipped, mean over steps: " + "; ".join(shares))
    health = health_line(run_dir, records)
    if health:
        lines.append(f"  {health}")
    low, high = _series(records, "train/calib_low"), _series(records, "train/calib_high")
    if low and high:
        lines.append(
            f"  clip bounds L,H {low[0][1]:.3f},{high[0][1]:.3f} (step {low[0][0]}) -> "
            f"{low[-1][1]:.3f},{high[-1][1]:.3f} (step {low[-1][0]})"
        )
    return lines


def health_line(run_dir: Path, records: list[dict]) -> str | None:
    """The run's health against `guards/health_ranges.yaml` for its precision (from its
    `recipe.yaml`; causes for the engine its `environment.json` names), or None without a
    readable recipe.yaml."""
    import yaml

    from nemo_fp8_rl.guards.health import precision_of, run_health
    from nemo_fp8_rl.runs.rundir import read_environment

    path = run_dir / "recipe.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict):
        return None
    engine = (read_environment(run_dir) or {}).get("engine")
    return run_health(records, precision_of(config), engine).line()


def next_lines(run_dir: Path) -> list[str]:
    """Where the outputs are and the commands to run next, with this run's paths."""
    lines = ["  outputs: metrics.jsonl, recipe.yaml, environment.json"]
    for name, what in (("checkpoints", "checkpoints/"), ("logs/tb", "TensorBoard events logs/tb/")):
        if (run_dir / name).exists():
            lines[-1] += f", {what}"
    run = shlex.quote(str(run_dir))
    lines += [
        "next:",
        f"  {command('eval')} --run {run}          # score the last checkpoint",
        f"  {command('compare')} {run} runs/<another run>   # e.g. the BF16 recipe's run",
    ]
    if (run_dir / "logs" / "tb").exists():
        tb = shlex.quote(str(run_dir / "logs" / "tb"))
        lines.append(f"  {tool('tensorboard')} --logdir {tb}")
    return lines


def shown(path: Path) -> Path:
    """`path` relative to the working folder when it is inside it (shorter to paste)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def print_summary(run_dir: Path) -> None:
    """Print the closing summary of the run in `run_dir`."""
    run_dir = shown(run_dir)
    print("\n".join([*summary_lines(run_dir, read_records(run_dir)), *next_lines(run_dir)]))
