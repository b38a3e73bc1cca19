"""Where a recipe runs: one predicate (`config.placement.on_cpu`), recorded in environment.json
and read back by `evals` from there."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.placement import on_cpu, placement
from nemo_fp8_rl.evals.nemo_cpu import is_nemo_cpu_run
from nemo_fp8_rl.runs import rundir


def test_on_cpu_is_gpus_per_node_zero() -> None:
    cpu = load_recipe("tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8")
    gpu = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    assert cpu.on_cpu and placement(cpu.config) == "cpu"
    assert not gpu.on_cpu and placement(gpu.config) == "gpu"
    assert not on_cpu({}) and not on_cpu({"cluster": {"gpus_per_node": 8}})


def test_environment_json_records_placement(tmp_path: Path) -> None:
    rundir.write_environment(tmp_path, "nemo", {}, placement="gpu")
    assert json.loads((tmp_path / "environment.json").read_text())["placement"] == "gpu"
    rundir.write_environment(tmp_path, "local", {})  # the embedded engine: always CPU
    assert json.loads((tmp_path / "environment.json").read_text())["placement"] == "cpu"


def test_evals_read_the_placement_not_the_folders(tmp_path: Path) -> None:
    env = tmp_path / "environment.json"
    (tmp_path / "nemo-inputs" / "model").mkdir(parents=True)  # folders alone decide nothing
    (tmp_path / "nemo-inputs" / "model" / "config.json").write_text("{}")
    assert not is_nemo_cpu_run(tmp_path)
    env.write_text(json.dumps({"engine": "nemo", "placement": "cpu"}))
    assert is_nemo_cpu_run(tmp_path)
    env.write_text(json.dumps({"engine": "nemo", "placement": "gpu"}))
    assert not is_nemo_cpu_run(tmp_path)
    env.write_text(json.dumps({"engine": "local", "placement": "cpu"}))
    assert not is_nemo_cpu_run(tmp_path)
    # a run written before environment.json recorded its placement: its saved recipe's
    env.write_text(json.dumps({"engine": "nemo"}))
    recipe = load_recipe("tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8").config
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert is_nemo_cpu_run(tmp_path)
