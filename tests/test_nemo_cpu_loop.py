"""NeMo RL's real GRPO loop on CPU, run as a user runs it: `nemo_fp8_rl.train --engine nemo`.

NeMo RL's `grpo.setup` and `grpo_train`, `Policy`, `RayWorkerGroup`, `RayVirtualCluster`,
`VllmGeneration`, `ResponseDataset`, math environment, checkpoint manager and logger run as
shipped on a real local Ray; the project's loss, `ShadowPolicy` and calibrator run inside them.
Stood in (`engines.nemo.cpu.stand_ins`): the Megatron and vLLM workers (CPU ones on real
megatron-core and transformers), CUDA IPC handles, and Ray's start (one logical GPU).

Each run is a child process of the real CLI. The 5-step run is in the contract suite; the
10-step run and the faults (a generation worker killed after a checkpoint, then `--resume`; a
refit stream that disagrees with its metadata) are `slow`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]
RECIPE = "tiny/grpo-tiny-qwen3-nemo-cpu-fp8"
HANG_S = 2400  # a hung run, not a slow one: a loaded 2-core machine is slow


def _command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "nemo_fp8_rl.cli.train", "--recipe", RECIPE, "--engine", "nemo",
        "--run-dir", str(run_dir), "--no-progress", *extra,
    ]  # fmt: skip


def _env(tag: str = "", **extra: str) -> dict[str, str]:
    """This environment (NeMo RL's tree on PYTHONPATH), tagged so the test finds its actors."""
    return {**os.environ, "NEMO_FP8_RL_TEST_TAG": tag, **extra}


def train(
    run_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI to completion; its output is kept for the failure message."""
    return subprocess.run(
        _command(run_dir, *extra), env=env or _env(), capture_output=True, text=True, timeout=HANG_S
    )


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train_rows(run_dir: Path) -> dict[int, dict]:
    """Per step: the merged `train/*` metrics NeMo RL's logger received."""
    out: dict[int, dict] = {}
    for row in rows(run_dir):
        if any(k.startswith("train/") for k in row):
            out.setdefault(row["step"], {}).update(row)
    return out


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    )


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("loop") / "run"
    ok(train(run_dir, "grpo.max_num_steps=5"))
    return run_dir


def test_the_loop_takes_its_steps_with_the_projects_metrics(five_steps: Path) -> None:
    steps = train_rows(five_steps)
    assert sorted(steps) == [1, 2, 3, 4, 5]
    for k, row in steps.items():
        for key in ("train/clip_lower_frac_neg", "train/clip_upper_frac_pos", "train/loss"):
            assert key in row, f"step {k}: {key} missing from {sorted(row)}"
    handed = (five_steps / "nemo_rl_config.yaml").read_text()
    assert "gpus_per_node: 1" in handed and "nemo-inputs/model" in handed
    env = json.loads((five_steps / "environment.json").read_text())
    assert env["engine"] == "nemo"


def test_calibration_runs_every_two_steps_and_its_state_is_checkpointed(five_steps: Path) -> None:
    steps = train_rows(five_steps)
    shadow = [k for k, row in steps.items() if any("shadow" in key for key in row)]
    assert shadow, f"no shadow metrics in {sorted(steps[1])}"
    ckpt = five_steps / "checkpoints" / "step_5"
    assert ckpt.is_dir(), sorted(p.name for p in (five_steps / "checkpoints").iterdir())
    saved = list(ckpt.rglob("*calibrat*"))
    assert saved, f"no calibrator state under {ckpt}"
