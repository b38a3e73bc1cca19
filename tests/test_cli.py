"""The console scripts as a user runs them: recipes list/show/validate and train --dry-run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import recipes as recipes_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke

BIN = Path(sys.executable).parent


def test_console_scripts_installed():
    for name in (
        "nemo_fp8_rl.train",
        "nemo_fp8_rl.recipes",
        "nemo_fp8_rl.submit",
        "nemo_fp8_rl.compare",
        "nemo_fp8_rl.eval",
    ):
        assert shutil.which(name, path=str(BIN)), f"console script {name} missing from {BIN}"


def test_validate_all_via_console_script():
    out = subprocess.run(
        [str(BIN / "nemo_fp8_rl.recipes"), "validate"], capture_output=True, text=True, check=True
    )
    from nemo_fp8_rl.config import find_recipes

    assert f"{len(find_recipes())} valid, 0 invalid" in out.stdout and len(find_recipes()) >= 38


def test_validate_reports_bad_recipe_and_fails(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"defaults: {Path('recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml').resolve()}\ngrpo:\n  max_num_step: 3\n"
    )
    assert invoke(recipes_cli.main, ["validate", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "grpo.max_num_step: unknown key" in out and "did you mean grpo.max_num_steps?" in out


def test_list_and_show_with_sources(capsys):
    assert recipes_cli.main(["list"]) == 0
    listing = capsys.readouterr().out
    assert (
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache" in listing and "fp8 +kv fp8" in listing
    )
    assert (
        recipes_cli.main(
            ["show", "tiny/grpo-tiny-qwen3-cpu-fp8", "--sources", "grpo.max_num_steps=3"]
        )
        == 0
    )
    shown = capsys.readouterr().out
    assert "max_num_steps: 3  # override" in shown
    assert "fp8_recipe: blockwise  # configs/precision/fp8-blockwise.yaml" in shown


def test_train_dry_run_prints_config_and_engine(capsys):
    assert train_cli.main(["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# engine: local  run dir: runs/grpo-tiny-qwen3-cpu-fp8" in out
    assert "calibration:\n    enabled: true" in out


def test_train_refuses_gpu_recipe_on_local_engine(capsys):
    argv = ["--recipe", "qwen3-4b/grpo-qwen3-4b-1n8g-fp8", "--engine", "local"]
    assert invoke(train_cli.main, argv) == 3
    assert (
        "the local engine runs CPU recipes only (cluster.gpus_per_node: 0)"
        in capsys.readouterr().err
    )


def test_bad_override_exits_2_with_message():
    proc = subprocess.run(
        [
            str(BIN / "nemo_fp8_rl.train"),
            "--recipe",
            "tiny/grpo-tiny-qwen3-cpu-fp8",
            "--dry-run",
            "grpo.max_num_steps=ten",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "grpo.max_num_steps: expected integer, got string ('ten')" in proc.stderr


@pytest.mark.parametrize(
    "module",
    [
        "nemo_fp8_rl.recipes",
        "nemo_fp8_rl.train",
        "nemo_fp8_rl.submit",
        "nemo_fp8_rl.compare",
        "nemo_fp8_rl.eval",
    ],
)
def test_python_dash_m(module):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    assert "usage:" in proc.stdout
