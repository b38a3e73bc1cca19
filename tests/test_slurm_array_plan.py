"""`submit --seeds` plans each seed as `train --seeds` does (`nemo_fp8_rl.runs.seed_plan`): the
group folder is checked, finished seeds are kept out of the array, and only the tasks of seeds
stopped part-way get `--resume`. Seed folders are real run directories in `tmp_path`; the job
script's per-task prologue is run by bash with the array variables Slurm would set."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from catalogue_cases import Workspace

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke

RECIPE = "tiny/grpo-tiny-qwen3-cpu-bf16"
TWO = "grpo.max_num_steps=2"


def _seed(group: Path, seed: int, steps: tuple[int, ...]) -> None:
    """`group/seed-<seed>`: a 2-step run of that seed with checkpoints at `steps` ((2,):
    finished; (1,): stopped part-way)."""
    ws = Workspace(group.parent, hf_source=lambda: None)
    ws.run(f"{group.name}/seed-{seed}", overrides=(f"grpo.seed={seed}", TWO), steps=steps)


def _submit(group: Path, *flags: str) -> list[str]:
    return ["--recipe", RECIPE, "--run-dir", str(group), *flags, TWO]


def _task(script: str, task: int, tmp_path: Path) -> list[str]:
    """RUN_DIR, TRAIN_SEED and TRAIN_RESUME as the rendered script sets them for array task
    `task` (the script up to its first use of the log folder, run by bash)."""
    prologue = script[: script.index("READY_FILE=")]
    probe = prologue + 'printf "%s\\n" "$RUN_DIR" "$TRAIN_SEED" "$TRAIN_RESUME"\n'
    env = {**os.environ, "SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "16"}
    env["SLURM_ARRAY_TASK_ID"] = str(task)
    proc = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (lambda g: Workspace(g.parent, lambda: None).run(g.name), "holds a single-seed run"),
        (
            lambda g: (g.mkdir(), (g / "seeds.json").write_text('{"runs": [1, 2]}')),
            "seeds.json: not a seeds summary written by --seeds",
        ),
    ],
    ids=["single-seed-run", "foreign-seeds-json"],
)
def test_submit_seeds_checks_the_group_folder(setup, said, tmp_path, capsys):
    group = tmp_path / "g"
    setup(group)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert invoke(submit_cli.main, _submit(group, "--seeds", "1-2", "--dry-run")) == 2
    assert said in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_submit_seeds_leaves_finished_seeds_out(tmp_path, capsys):
    group = tmp_path / "g"
    _seed(group, 1, (2,))
    _seed(group, 3, (2,))
    assert invoke(submit_cli.main, _submit(group, "--seeds", "1-3", "--dry-run")) == 0
    out, err = capsys.readouterr()
    assert '#SBATCH --array="2"\n' in out
    assert "kept (finished before): 1, 3" in err
    # every seed finished: nothing is written or submitted, and the exit code is 0
    assert invoke(submit_cli.main, _submit(group, "--seeds", "1,3")) == 0
    out = capsys.readouterr().out
    assert "kept (finished before): 1, 3" in out
    assert "nothing to submit: every seed of g finished before" in out
    assert "Submitted" not in out and not (group / "slurm").exists()


def test_submit_seeds_resume_only_the_seeds_stopped_part_way(tmp_path, capsys):
    """Seed 1 never started, seed 2 stopped at step 1 of 2, seed 3 finished: with --resume the
    array is tasks 1-2, task 2 resumes, task 1 starts (train --resume would refuse its folder);
    with --overwrite every task starts over."""
    group = tmp_path / "g"
    _seed(group, 2, (1,))
    _seed(group, 3, (2,))
    assert invoke(submit_cli.main, _submit(group, "--seeds", "1-3", "--resume", "--dry-run")) == 0
    script = capsys.readouterr().out
    assert '#SBATCH --array="1-2"\n' in script and "SEED_RESUME=2\n" in script
    assert _task(script, 1, tmp_path) == [str(group / "seed-1"), "1", ""]
    assert _task(script, 2, tmp_path) == [str(group / "seed-2"), "2", "--resume"]
    assert not (group / "seed-1").exists()  # a dry run writes nothing
    assert (
        invoke(submit_cli.main, _submit(group, "--seeds", "1-3", "--overwrite", "--dry-run")) == 0
    )
    script = capsys.readouterr().out
    assert '#SBATCH --array="1-3"\n' in script and "SEED_RESUME=''" in script
    for task in (1, 2, 3):
        assert _task(script, task, tmp_path)[2] == "--overwrite"


def test_submit_seeds_dry_run_prints_the_plan_line_train_prints(tmp_path, capsys):
    group = tmp_path / "g"
    _seed(group, 2, (1,))
    _seed(group, 3, (2,))
    plan = "2 seed(s) of g {}; kept (finished before): 3; start: 1; resume: 2\n"
    argv = _submit(group, "--seeds", "1-3", "--resume", "--dry-run")
    assert invoke(train_cli.main, argv) == 0
    assert capsys.readouterr().out.startswith(plan.format("on the local engine, 1 at a time"))
    assert invoke(submit_cli.main, argv) == 0
    assert plan.format("in one Slurm job array") in capsys.readouterr().err


def test_array_task_trains_the_config_train_seeds_trains(tmp_path, capsys):
    """An array task loads the frozen recipe with its seed in every key the recipe ties to the
    seed (`data.train.seed: ${grpo.seed}`), so it trains the same config as `train --seeds`
    (and a finished array is planned as finished, not as a run with other settings)."""
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.slurm.jobs import frozen_recipe_text

    group = tmp_path / "g"
    assert invoke(submit_cli.main, _submit(group, "--seeds", "1-2", "--dry-run")) == 0
    script = capsys.readouterr().out
    assert "SEED_KEYS='grpo.seed data.train.seed'\n" in script
    # what an srun step (a new bash) sees of the prologue: its exported SEED_OVERRIDES, split
    prologue = (
        script[: script.index("READY_FILE=")] + "bash -c 'printf \"%s\\n\" $SEED_OVERRIDES'\n"
    )
    env = {**os.environ, "SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "16"}
    env["SLURM_ARRAY_TASK_ID"] = "2"
    proc = subprocess.run(
        ["bash", "-c", prologue], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=200
    )
    args = proc.stdout.splitlines()
    assert args == ["grpo.seed=2", "data.train.seed=2"], proc.stderr
    frozen = tmp_path / "frozen.yaml"
    frozen.write_text(frozen_recipe_text(load_recipe(RECIPE, [TWO], run_dir=group)))
    task = load_recipe(frozen, args, run_dir=group / "seed-2").config
    local = load_recipe(RECIPE, [TWO, "grpo.seed=2"], run_dir=group / "seed-2").config
    assert task["data"] == local["data"] and task["grpo"] == local["grpo"]
