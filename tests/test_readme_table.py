"""scripts/readme_tiny_table.py: the README's tiny-run table from run directories.

The run directories are written with the embedded engine's real `MetricsLogger` and hold the
real resolved tiny recipes; the metric values are chosen here, so every cell is recomputed from
the same inputs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.local.metrics import MetricsLogger

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "readme_tiny_table", ROOT / "scripts/readme_tiny_table.py"
)
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)

STEPS = 30
CALIBRATIONS = (1, 11, 21)  # the tiny recipes' schedule: every 10 steps from step 1


def write_run(root: Path, variant: str) -> Path:
    recipe = load_recipe(ROOT / f"recipes/tiny/grpo-tiny-qwen3-cpu-{variant}.yaml")
    config = {**recipe.config, "grpo": {**recipe.config["grpo"], "max_num_steps": STEPS}}
    run_dir = root / f"grpo-tiny-qwen3-cpu-{variant}"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(config))
    logger = MetricsLogger(run_dir, tensorboard=False)
    logger.log(0, {"validation/accuracy": 0.5, "validation/accuracy_sampled": 0.3})
    high = 1.2
    for step in range(1, STEPS + 1):
        m = {
            "train/reward": 0.4 + 0.01 * step,
            "train/entropy": 0.5 + (0.3 if variant == "fp8" and step >= 20 else 0.0),
            "train/clip_lower_frac_neg": 0.01,
            "train/token_mult_prob_error": 1.03,
            "train/gen_kl_error": 2e-3,
            "train/calib_low": 0.8,
            "train/calib_high": high,
        }
        if variant != "bf16" and step in CALIBRATIONS:
            m.update({"train/ratio_nmae": 0.012, "train/prob_nmae": 0.01})
            m.update({"train/ratio_amplification": 1.2, "train/prob_relative_error_over_nmae": 2.0})
        if variant == "fp8" and step in CALIBRATIONS:
            k = CALIBRATIONS.index(step)
            nxt = high + 0.05 if k == 1 else high  # only the second calibration moves H
            m.update(
                {
                    "train/calib_n_neg": 300.0 + k,
                    "train/calib_bf16_lower_count_neg": [0.0, 12.0, 5.0][k],
                    "train/calib_low_target_ci90_width": [0.03, 0.16, 0.08][k],
                    "train/calib_high_target": [1.2, 1.3, 2.0][k],
                    "train/calib_high_next": nxt,
                }
            )
        if variant == "fp8":
            m["train/calib_high_next"] = m.get("train/calib_high_next", high)
        logger.log(step, m)
        if variant == "fp8" and step in CALIBRATIONS:
            high = m["train/calib_high_next"]
        if step % 10 == 0:
            logger.log(step, {"validation/accuracy": 0.5 + step / 100})
    logger.close()
    return run_dir


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    for variant, _ in table.VARIANTS:
        write_run(tmp_path, variant)
    return tmp_path


def cells(block: str, label: str) -> list[str]:
    (line,) = [row for row in block.splitlines() if row.startswith(f"| {label}")]
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_table_cells_are_recomputed_from_the_runs(run_root: Path) -> None:
    block = table.render(run_root)
    assert cells(block, "validation accuracy, greedy") == ["0.500 → 0.800 (0.800)"] * 3
    assert cells(block, "reward, mean of the last 10") == ["0.655"] * 3  # 0.4 + 0.01·mean(21..30)
    assert cells(block, "entropy surge onset") == ["none", "none", "step 20"]
    assert cells(block, "clip bounds in force")[:2] == ["0.80; 1.20"] * 2
    assert cells(block, "clip bounds in force")[2] == "0.80; 1.20–1.25"
    assert cells(block, "calibrations that moved H") == ["—", "—", "1 of 3; 1 of 3"]
    assert cells(block, "m: BF16-clipped")[2] == "0–12"
    assert cells(block, "width of the distribution-free")[2] == "0.030–0.160"
    assert cells(block, "ratio NMAE")[1:] == ["1.20 % (1.20–1.20 %)"] * 2
    assert cells(block, "paper-style quotient") == ["—", "1.20× (1.20)", "1.20× (1.20)"]
    assert cells(block, "per-token relative probability error")[2] == "2.00× (2.00)"
    settings = block.splitlines()[0]
    assert "seed 1" in settings and "every 10 steps from ≥ 64 tokens" in settings
    assert "the method's default: every 20 steps" in settings


def test_write_replaces_only_the_marked_block(run_root: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{table.BEGIN}\nold\n{table.END}\noutro\n")
    assert table.main(["--runs", str(run_root), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "\nold\n" not in text
    assert "| paper-style quotient" in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="exactly once"):
        table.main(["--runs", str(run_root), "--write", str(readme)])


def test_refuses_an_incomplete_run(run_root: Path) -> None:
    recipe = run_root / "grpo-tiny-qwen3-cpu-fp8" / "recipe.yaml"
    config = yaml.safe_load(recipe.read_text())
    config["grpo"]["max_num_steps"] = STEPS + 10
    recipe.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit, match="incomplete"):
        table.render(run_root)


def test_an_archive_reads_back_as_the_same_table(run_root: Path, tmp_path: Path) -> None:
    assert table.main(["--runs", str(run_root), "--archive", str(tmp_path / "kept")]) == 0
    assert (tmp_path / "kept" / "grpo-tiny-qwen3-cpu-fp8" / "metrics.jsonl.gz").exists()
    assert table.render(tmp_path / "kept") == table.render(run_root)
