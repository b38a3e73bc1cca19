"""Every shipped recipe for NeMo RL's loop on CPU (`tiny-nemo/`) takes 3 real steps through
`nemo_fp8_rl.train --engine nemo`, in the NeMo RL environment (`scripts/nemo-rl-contract.sh`,
with or without `--vllm`): NeMo RL's `grpo_train` as shipped, the project's CPU workers
(`engines.nemo.cpu`), the served-precision check at step 0 and after every refit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_cpu_recipes_run import cpu_recipes, steps_logged
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.slow,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]
HANG_S = 2400  # a hung run, not a slow one: a loaded 2-core machine is slow


@pytest.mark.parametrize("name", cpu_recipes(("tiny-nemo/",)))
def test_every_nemo_loop_cpu_recipe_runs_three_steps(name, tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "nemo_fp8_rl.cli.train", "--recipe", name, "--engine", "nemo",
        "--run-dir", str(run_dir), "--no-progress", "grpo.max_num_steps=3",
        "checkpointing.save_period=3",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {1, 2, 3} <= steps_logged(run_dir)
    assert "served-precision (step 0)" in proc.stdout


def test_on_breach_stop_ends_nemo_rls_loop_with_a_checkpoint_that_resumes(tmp_path):
    """A real breach on NeMo RL's loop (the recipe's range for token_mult_prob_error set below
    its healthy value): the run stops at step 5 with the located error (exit 1) after NeMo RL
    saved that step's checkpoint, and the printed command resumes it."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "nemo_fp8_rl.cli.train", "--recipe",
        "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8", "--engine", "nemo", "--run-dir", str(run_dir),
        "--no-progress", "grpo.max_num_steps=6", "checkpointing.save_period=1",
        "health.limits={train/token_mult_prob_error: 0.5}", "health.on_breach=stop",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "(step 5): stopped by health.on_breach: stop: train/token_mult_prob_error median" in out
    assert (
        f"--run-dir {run_dir} --resume health.on_breach=warn" in out
        and (run_dir / "checkpoints" / "step_5").is_dir()
    )
    assert max(steps_logged(run_dir)) == 5
    resumed = [*command[:-1], "health.on_breach=warn", "--resume"]
    proc = subprocess.run(resumed, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert max(steps_logged(run_dir)) == 6
