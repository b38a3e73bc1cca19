"""`scripts/nemo-rl-env.sh --vllm` refuses, at once and before building anything, a NeMo RL tree
whose vLLM pin has no CPU block-FP8 kernel (v0.7.0: vllm 0.20.0), naming the tree to use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "nemo-rl-env.sh"


def _tree(root: Path, vllm: str) -> Path:
    (root / "nemo_rl").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[project.optional-dependencies]\nvllm = ["vllm=={vllm}"]\n'
    )
    return root


def test_vllm_with_a_tree_pinning_an_old_vllm_is_refused_at_once_with_the_tree_to_use(tmp_path):
    tree = _tree(tmp_path / "nemo-rl", "0.20.0")
    env_dir = tmp_path / "env"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--vllm", str(tree), "--", "true"],
        capture_output=True,
        text=True,
        timeout=600,  # a hang, not a loaded machine
        env={**os.environ, "NEMO_RL_VLLM_ENV": str(env_dir)},
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"error: {tree}/pyproject.toml: pins vllm==0.20.0, whose CPU build lacks"
    )
    assert "Fix: use NeMo RL main at 7ea279a or later" in line and "nemo-rl-7ea279a.tar.gz" in line
    assert not env_dir.exists()  # nothing built


def test_preflight_without_nemo_rl_names_the_script_that_builds_its_environment(capsys):
    import pytest

    from nemo_fp8_rl.cli.common import invoke
    from nemo_fp8_rl.cli.train import main
    from nemo_fp8_rl.engines.nemo.driver.compat import detect

    if detect().version is not None:
        pytest.skip("NeMo RL is importable here: its missing-NeMo-RL error cannot be shown")
    argv = ["--recipe", "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", "--preflight"]
    assert invoke(main, argv) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --preflight: NeMo RL is not usable here")
    assert "bash scripts/nemo-rl-env.sh <NeMo RL tree> -- python -m nemo_fp8_rl.train" in line
    assert "../shared/vendor/nemo-rl-*.tar.gz" in line  # the offline route to its source
