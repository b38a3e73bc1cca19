"""CalibratedClippedPGLoss (calibration off) against NeMo RL's own `ClippedPGLossFn`.

Runs only when `NEMO_RL_SRC` names a NeMo RL source tree (the directory holding `nemo_rl/`).
The comparison runs in a child interpreter, `NEMO_RL_PYTHON` (default: this one), with
`NEMO_RL_SRC` on PYTHONPATH, because NeMo RL's import chain needs packages this project does not
(pyzmq, ray, transformers < 5.12, …, plus torch, pydantic and pytest). The same file is the
child's script. Checked against NVIDIA-NeMo/RL commit 7ea279a (`nemo_rl.__version__` 0.6.0).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2, 3)


@pytest.mark.nemo_rl
@pytest.mark.slow
def test_equals_nemo_rl_clipped_pg_loss_fn() -> None:
    src = os.environ.get("NEMO_RL_SRC")
    if not src:
        pytest.skip(
            "NEMO_RL_SRC is not set (point it at a NeMo RL source tree to compare with ClippedPGLossFn)"
        )
    if not (Path(src) / "nemo_rl" / "algorithms").is_dir():
        pytest.fail(
            f"NEMO_RL_SRC={src} does not contain nemo_rl/algorithms; point it at the repository root"
        )
    python = os.environ.get("NEMO_RL_PYTHON", sys.executable)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(HERE.parent), str(HERE)])}
    proc = subprocess.run([python, __file__], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(
            f"comparison with NeMo RL failed to run under {python} (set NEMO_RL_PYTHON to an "
            f"interpreter with NeMo RL's dependencies):\n{proc.stderr[-4000:]}"
        )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"NeMo RL version {report['version']}: {report['cases']} cases compared")
    assert report["cases"] > 0 and report["failures"] == [], report["failures"]


def _compare_one(name: str, cfg: dict, seed: int) -> list[str]:
    """Loss, gradient and every NeMo RL metric of one config on one random micro-batch."""
    import torch
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
    from test_loss import make_batch

    from nemo_fp8_rl.loss import CalibratedClippedPGLoss

    lp, data = make_batch(seed)
    gs, gt = (
        data["sample_mask"].sum(),
        (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum(),
    )
    lp_ours, lp_theirs = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ours = CalibratedClippedPGLoss(cfg)(
        next_token_logprobs=lp_ours, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    theirs = ClippedPGLossFn(ClippedPGLossConfig(**cfg))(
        next_token_logprobs=lp_theirs, data=data, global_valid_seqs=gs, global_valid_toks=gt
    )
    ours[0].backward()
    theirs[0].backward()
    bad = []
    if not torch.allclose(ours[0], theirs[0], rtol=1e-6, atol=1e-6):
        bad.append(f"{name}/{seed}: loss {ours[0].item()} vs {theirs[0].item()}")
    if not torch.allclose(lp_ours.grad, lp_theirs.grad, rtol=1e-6, atol=1e-7):
        bad.append(f"{name}/{seed}: gradient differs")
    for key, value in theirs[1].items():
        mine = ours[1].get(key)
        if mine is None or not math.isclose(float(mine), float(value), rel_tol=1e-6, abs_tol=1e-6):
            bad.append(f"{name}/{seed}: metric {key} {mine} vs {value}")
    return bad


def _main() -> None:
    """Child: compare every config of test_loss.CONFIGS on several seeds; print a JSON report."""
    import nemo_rl
    import torch
    from test_loss import CONFIGS

    torch.set_num_threads(1)
    failures = [
        msg
        for name, cfg in sorted(CONFIGS.items())
        for seed in SEEDS
        for msg in _compare_one(name, cfg, seed)
    ]
    version = getattr(nemo_rl, "__version__", "unknown")
    print(
        json.dumps({"version": version, "cases": len(CONFIGS) * len(SEEDS), "failures": failures})
    )


if __name__ == "__main__":
    _main()
