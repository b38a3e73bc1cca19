"""`python -m nemo_fp8_rl.study` with bad input: one error line, exit 2, nothing lost or written.

Each case is what a user should see (`error: <where>: <what>. Fix: <how>`, no traceback), and
that their files and the report folder are untouched. Run folders are written with the real
recipe loader (the recipe.yaml a run saves) and a metrics.jsonl; no run is started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.study import NAMES, STUDY_DIR, main
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.study import grid

SHORT = "grpo.max_num_steps=5"


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = invoke(main, argv, "nemo_fp8_rl.study")
    err = capsys.readouterr().err
    return code, err


def fake_run(out: Path, name: str, seed: int, overrides: list[str], steps: int = 5) -> Path:
    """A finished run folder as train leaves it: the resolved recipe and per-step metrics."""
    recipe = load_recipe(STUDY_DIR / f"{name}.yaml", [*overrides, f"grpo.seed={seed}"])
    folder = out / name / f"seed-{seed}"
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(recipe.to_yaml(with_sources=True))
    rows = [{"step": 0, "validation/accuracy": 0.3, "warmup/steps": 290.0}]
    for k in range(1, steps + 1):
        rows.append({"step": k, "train/entropy": 0.5, "train/clip_lower_frac_neg": 0.01 * seed,
                     "validation/accuracy": 0.4 + 0.01 * seed + (0.01 if "fp8" in name else 0)})  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_users_file_in_a_seed_folder_is_refused_and_kept(tmp_path, capsys):
    seed_dir = tmp_path / "O" / "grpo-study-bf16" / "seed-1"
    seed_dir.mkdir(parents=True)
    (seed_dir / "notes.txt").write_text("notes")
    argv = ["--seeds", "1", "--jobs", "1", "--out", str(tmp_path / "O"), "--report",
            str(tmp_path / "R"), SHORT]  # fmt: skip
    code, err = run(argv, capsys)
    assert code == 2 and err.startswith("error: ") and "notes.txt" in err and "Fix:" in err
    assert (seed_dir / "notes.txt").read_text() == "notes"
    assert not (tmp_path / "R").exists() and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "x"], "--jobs"),
        (["--seeds", "-1"], "--seeds"),
        (["--seeds", "3-1"], "--seeds"),
        (["grpo.max_num_stepz=5"], "max_num_stepz"),
    ],
)
def test_bad_arguments_and_overrides_are_usage_errors(tmp_path, capsys, argv, says):
    code, err = run([*argv, "--out", str(tmp_path / "O"), "--report", str(tmp_path / "R")], capsys)
    assert code == 2 and "error:" in err and says in err and "Traceback" not in err
    assert not (tmp_path / "O").exists() and not (tmp_path / "R").exists()


def test_a_report_folder_under_a_file_is_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, err = run(["--out", str(tmp_path / "O"), "--report", str(tmp_path / "file" / "R"),
                     SHORT], capsys)  # fmt: skip
    assert code == 2 and "is a file" in err and not (tmp_path / "O").exists()


def test_analyse_only_without_runs_writes_nothing(tmp_path, capsys):
    (tmp_path / "O").mkdir()
    code, err = run(["--analyse-only", "--out", str(tmp_path / "O"), "--report",
                     str(tmp_path / "R")], capsys)  # fmt: skip
    assert code == 2 and "no study runs" in err
    assert not (tmp_path / "R").exists() and list((tmp_path / "O").iterdir()) == []


def test_the_committed_report_is_written_only_when_asked(tmp_path, capsys):
    code, err = run(["--analyse-only", "--out", "docs/study/runs", "--report", "docs/study"],
                    capsys)  # fmt: skip
    assert code == 2 and "--write-docs" in err


def test_a_garbled_metrics_file_names_its_line(tmp_path, capsys):
    folder = fake_run(tmp_path / "O", NAMES[0], 1, [SHORT])
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    code, err = run(["--analyse-only", "--seeds", "1", "--out", str(tmp_path / "O"),
                     "--report", str(tmp_path / "R")], capsys)  # fmt: skip
    assert code == 2 and "metrics.jsonl:7" in err and "Traceback" not in err
    assert not (tmp_path / "R").exists()


def test_a_finished_run_is_kept_only_with_the_same_settings(tmp_path, capsys):
    out = tmp_path / "O"
    same = fake_run(out, NAMES[0], 1, [SHORT])
    spec = grid.plan([STUDY_DIR / f"{NAMES[0]}.yaml"], [1], out, (SHORT,))[0]
    assert grid.action(spec) == "keep"
    other = fake_run(out, NAMES[0], 2, [SHORT, "policy.megatron_cfg.optimizer.lr=1e-3"])
    code, err = run(["--seeds", "1-2", "--out", str(out), "--report", str(tmp_path / "R"),
                     SHORT], capsys)  # fmt: skip
    assert code == 2 and "other settings" in err and "optimizer.lr" in err and "--overwrite" in err
    assert (same / "metrics.jsonl").exists() and (other / "metrics.jsonl").exists()
    spec2 = grid.plan([STUDY_DIR / f"{NAMES[0]}.yaml"], [2], out, (SHORT,))[0]
    assert grid.action(spec2, overwrite=True) == "rerun"
    unfinished = grid.plan([STUDY_DIR / f"{NAMES[0]}.yaml"], [1], out, ("grpo.max_num_steps=6",))
    with pytest.raises(Exception, match="max_num_steps"):
        grid.action(unfinished[0])


def test_analyse_only_reports_the_runs_with_the_train_seed_syntax(tmp_path, capsys):
    out = tmp_path / "O"
    for name in NAMES:
        for seed in (1, 2):
            fake_run(out, name, seed, [SHORT])
    code, err = run(["--analyse-only", "--seeds", "1-2", "--out", str(out), "--report",
                     str(tmp_path / "R")], capsys)  # fmt: skip
    assert code == 0, err
    text = (tmp_path / "R" / "tables.md").read_text()
    assert text.startswith("Seeds 1, 2;") and "(n=2)" in text
    results = json.loads((tmp_path / "R" / "results.json").read_text())
    assert sorted(results["per_seed"][NAMES[0]]) == ["1", "2"]


def test_the_module_entry_point_prints_the_error_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "nemo_fp8_rl.study", "--jobs", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("error:") == 1
