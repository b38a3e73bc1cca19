"""The loss and the calibrator on CUDA tensors give the CPU results (skipped without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch
from test_loss import CONFIGS, make_batch

from nemo_fp8_rl.loss import CalibratedClippedPGLoss

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def run(cfg: dict, lp: torch.Tensor, data: dict, device: str):
    data = {k: v.to(device) for k, v in data.items()}
    lp = lp.to(device).requires_grad_()
    fn = CalibratedClippedPGLoss(cfg)
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    loss, metrics = fn(
        next_token_logprobs=lp,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=mask.sum(),
    )
    loss.backward()
    return loss.item(), metrics, lp.grad.cpu(), fn


@pytest.mark.parametrize("name", ["default", "tis", "gspo", "no_kl"])
def test_cuda_matches_cpu(name: str) -> None:
    lp, data = make_batch(0)
    cpu, gpu = run(CONFIGS[name], lp, data, "cpu"), run(CONFIGS[name], lp, data, "cuda")
    assert math.isclose(cpu[0], gpu[0], rel_tol=1e-5, abs_tol=1e-6)
    assert torch.allclose(cpu[2], gpu[2], rtol=1e-5, atol=1e-7)
    for key, value in cpu[1].items():
        assert math.isclose(value, gpu[1][key], rel_tol=1e-5, abs_tol=1e-6), key


def test_calibration_step_on_cuda_matches_cpu() -> None:
    lp, data = make_batch(1, b=64, s=65)
    data["bf16_prev_logprobs"] = data["prev_logprobs"] + 0.01 * torch.randn_like(
        data["prev_logprobs"]
    )
    data["bf16_curr_logprobs"] = lp + 0.01 * torch.randn_like(lp)
    cfg = {"calibration": {"enabled": True, "min_tokens": 16}}
    cpu_fn, gpu_fn = run(cfg, lp, data, "cpu")[3], run(cfg, lp, data, "cuda")[3]
    cpu_m, gpu_m = cpu_fn.calibrator.update(0), gpu_fn.calibrator.update(0)
    assert cpu_fn.calibrator.bounds == pytest.approx(gpu_fn.calibrator.bounds, rel=1e-6)
    assert cpu_m["calib_alpha"] == gpu_m["calib_alpha"]
