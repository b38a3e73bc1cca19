"""The precision dose study: arms, the surge threshold rule, and (from archived runs) its tables.

Arms: `bf16`, and for each format of `endpoints.yaml` (`dose.formats`) `<fmt>-uncalibrated`
and `<fmt>` (calibrated); recipe files `recipes/study/dose/grpo-dose-<arm>.yaml`.
Surge threshold (pre-registered rule `bf16_mean_plus_2sd`): with r_s the largest rise of
train/entropy above its trailing-window minimum in BF16 seed s, `threshold = mean(r) + 2 SD(r)`
(sample SD, n − 1).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from nemo_fp8_rl.study import endpoints

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "study" / "dose"
DOCS = ROOT / "docs" / "study" / "dose"
ARCHIVE = DOCS / "runs"


def arm_name(arm: str) -> str:
    """The recipe (and run folder) name of an arm: `grpo-dose-<arm>`."""
    return f"grpo-dose-{arm}"


def arms(formats: list[str]) -> list[str]:
    """Recipe names of the arms of `formats` (`bf16`, or a study format: both its arms)."""
    known = endpoints.load().dose.formats
    out = []
    for fmt in formats:
        if fmt == "bf16":
            out.append(arm_name("bf16"))
        elif fmt in known:
            out += [arm_name(f"{fmt}-uncalibrated"), arm_name(fmt)]
        else:
            raise ValueError(f"unknown dose format {fmt!r}: use bf16 or one of {known}")
    return out


def largest_rise(records: list[dict], window: int) -> float:
    """The largest rise of train/entropy above its trailing-window minimum (steps ≥ 1)."""
    ent = [r["train/entropy"] for r in records if r["step"] >= 1 and "train/entropy" in r]
    return endpoints.largest_rise(ent, window)


def surge_threshold(rises: list[float]) -> float:
    """mean + 2 SD of the BF16 seeds' largest rises (module doc); needs two seeds."""
    vals = [r for r in rises if math.isfinite(r)]
    if len(vals) < 2:
        raise ValueError(f"the surge threshold needs >= 2 finished BF16 runs, got {len(vals)}")
    return statistics.fmean(vals) + 2 * statistics.stdev(vals)


def pass_at_k_run(run_dir: Path) -> dict:
    """pass@k of a finished run as pre-registered: its last checkpoint in BF16, the validation
    split, `dose.pass_at_k.samples` samples per problem at the validation sampling settings.
    Writes `<run>/dose_passk.json` (atomically) and returns it."""
    import json

    from nemo_fp8_rl.config.project import TaskConfig
    from nemo_fp8_rl.config.safe_files import write_atomic
    from nemo_fp8_rl.evals import local
    from nemo_fp8_rl.evals.checkpoints import select_local
    from nemo_fp8_rl.evals.passk import pass_at_k
    from nemo_fp8_rl.evals.request import read_run_config
    from nemo_fp8_rl.evals.suites import Benchmark, Sampling, Suite
    from nemo_fp8_rl.tiny.task import validation_problems

    spec = endpoints.load().dose.pass_at_k
    config = read_run_config(run_dir)
    gen, task = config["policy"]["generation"], TaskConfig(**config["local"]["task"])
    sampling = Sampling(
        gen.get("val_temperature", gen["temperature"]),
        gen.get("val_top_p", gen["top_p"]),
        gen.get("val_top_k", gen["top_k"]),
    )
    bench = Benchmark("validation", "validation split", spec.samples, digits=task.digits)
    selection = select_local(run_dir, "last")
    model, tokenizer = local.load_policy(run_dir, config, selection)
    problems = validation_problems(task)
    suite = Suite("dose", "local", (bench,), sampling)
    _, correct = local.score(model, tokenizer, problems.prompts, problems.answers, bench, suite)
    out = {
        "step": selection.step,
        "samples": spec.samples,
        "problems": len(correct),
        "pass_at_k": {str(k): pass_at_k(correct, spec.samples, k) for k in spec.k},
        "correct_per_problem": correct,
    }
    write_atomic(run_dir / "dose_passk.json", json.dumps(out) + "\n")
    return out


def finished(run_dir: Path) -> bool:
    """True when the run's metrics reach its recipe's last step."""
    from nemo_fp8_rl.config.safe_yaml import load_yaml_file
    from nemo_fp8_rl.study.analysis import metrics_file, read_records

    recipe = run_dir / "recipe.yaml"
    if metrics_file(run_dir) is None or not recipe.is_file():
        return False
    steps = load_yaml_file(recipe)["grpo"]["max_num_steps"]  # bounded, as every YAML read
    return read_records(run_dir)[-1]["step"] == steps


def pass_at_k_all(out: Path, runs: str = "grpo-dose-*") -> int:
    """`pass_at_k_run` for every finished run under `out/<runs>/` (a glob of run names) that
    has none yet; returns 0."""
    for run_dir in sorted(p for p in out.glob(f"{runs}/seed-*") if p.is_dir()):
        if (run_dir / "dose_passk.json").exists() or not finished(run_dir):
            continue
        res = pass_at_k_run(run_dir)
        print(f"{run_dir.parent.name}/{run_dir.name}: {res['pass_at_k']}")
    return 0


ARCHIVED = (
    "metrics.jsonl", "dose_passk.json", "study_wall_seconds.json", "study_provenance.json"
)  # fmt: skip


def _engine_provenance(run_dir: Path) -> str:
    """A run's provenance as its engine recorded it (`environment.json`), for a run whose
    launcher ended before writing `study_provenance.json`."""
    import json

    env = json.loads((run_dir / "environment.json").read_text(encoding="utf-8"))
    record = {
        **(env.get("provenance") or {}),
        "source": "environment.json (the launcher ended first)",
    }
    return json.dumps(record, indent=1) + "\n"


def archive(out: Path, dest: Path = ARCHIVE, runs: str = "grpo-dose-*") -> list[Path]:
    """Copy each finished run under `out/<runs>/` (a glob of run names): its metrics (gzip,
    mtime 0), pass@k, wall time and provenance, to `dest` (each file written atomically, never
    through a link: `safe_files.write_atomic`)."""
    import gzip
    import io

    from nemo_fp8_rl.config.safe_files import write_atomic

    written = []
    for run_dir in sorted(p for p in out.glob(f"{runs}/seed-*") if p.is_dir()):
        if not finished(run_dir) or not (run_dir / "dose_passk.json").exists():
            print(f"skipped  {run_dir.parent.name}/{run_dir.name} (unfinished or no pass@k)")
            continue
        target = dest / run_dir.parent.name / run_dir.name
        target.mkdir(parents=True, exist_ok=True)
        packed = io.BytesIO()  # the header names metrics.jsonl, as gzip of the file would
        with gzip.GzipFile(
            str(target / "metrics.jsonl.gz"), "wb", 9, packed, mtime=0
        ) as f:  # safe-write: buffer
            f.write((run_dir / ARCHIVED[0]).read_bytes())
        write_atomic(target / "metrics.jsonl.gz", packed.getvalue())
        for name in ARCHIVED[1:]:
            if (run_dir / name).exists():
                write_atomic(target / name, (run_dir / name).read_bytes())
        if not (run_dir / ARCHIVED[-1]).exists() and (run_dir / "environment.json").exists():
            write_atomic(target / ARCHIVED[-1], _engine_provenance(run_dir))
        written.append(target)
        print(f"archived {run_dir.parent.name}/{run_dir.name}")
    return written
