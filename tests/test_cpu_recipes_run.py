"""Every shipped CPU recipe the embedded engine runs (`tiny/`, `study/`) takes 3 real steps as
a user runs it (`nemo_fp8_rl.train --recipe R`), with a 5-step warm-up and a small validation
set so the whole set stays within minutes per recipe; the NeMo RL loop's CPU recipes
(`tiny-nemo/`) are in test_nemo_cpu_recipes_run.py (the contract suite's environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import train
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import find_recipes, load_recipe, short_name

THREE_STEPS = [
    "grpo.max_num_steps=3",
    "grpo.val_at_start=false",
    "grpo.val_period=3",
    "checkpointing.save_period=3",
    "local.warmup.steps=5",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=16",
]


def cpu_recipes(folders: tuple[str, ...]) -> list[str]:
    """Short names of the shipped recipes with `cluster.gpus_per_node: 0` under `folders`."""
    return [
        short_name(p)
        for p in find_recipes()
        if short_name(p).startswith(folders)
        and load_recipe(p).config["cluster"]["gpus_per_node"] == 0
    ]


def steps_logged(run_dir: Path) -> set[int]:
    """The steps whose training metrics `metrics.jsonl` holds."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"] for r in rows if "event" not in r and any(k.startswith("train/") for k in r)}


EMBEDDED = cpu_recipes(("tiny/", "study/"))


@pytest.mark.slow
@pytest.mark.parametrize("name", EMBEDDED)
def test_every_embedded_cpu_recipe_runs_three_steps(name, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--recipe", name, "--run-dir", str(run_dir), "--no-progress", *THREE_STEPS]
    assert invoke(train.main, argv) == 0, capsys.readouterr().err
    assert {1, 2, 3} <= steps_logged(run_dir)
    assert (run_dir / "checkpoints" / "step_3").is_dir()
