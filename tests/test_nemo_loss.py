"""The loss NeMo RL's workers run: pickling, a separate process, shadow keys, the payload."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nemo_fp8_rl.calibration import Calibrator
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.project import CalibrationConfig
from nemo_fp8_rl.engines.nemo.worker.loss import (
    BF16_CURR,
    BF16_PREV,
    NemoCalibratedLoss,
    shadow_view,
)
from nemo_fp8_rl.engines.nemo.worker.observations import (
    PAYLOAD_KEY,
    ObservationRecorder,
    ShadowObservations,
)
from nemo_fp8_rl.loss import CalibratedClippedPGLoss

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]


def _cfg(*overrides: str) -> dict:
    base = ["loss_fn.calibration.min_tokens=4"]
    return load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", [*base, *overrides]).section("loss_fn")


def _batch(rows: int = 6, seq: int = 7, seed: int = 0, shadow: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    prev = -torch.rand(rows, seq, generator=g) * 2
    prev[:, 0] = 0
    mask = torch.ones(rows, seq)
    mask[:, :2] = 0
    mask[0, 5:] = 0
    data = {
        "input_ids": torch.randint(0, 50, (rows, seq), generator=g),
        "advantages": torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0)
        .unsqueeze(1)
        .expand(rows, seq)
        .clone(),
        "prev_logprobs": prev,
        "generation_logprobs": prev + 0.05 * torch.randn(rows, seq, generator=g),
        "reference_policy_logprobs": prev.clone(),
        "token_mask": mask,
        "sample_mask": torch.ones(rows),
    }
    if shadow:
        data[BF16_PREV] = prev + 0.03 * torch.randn(rows, seq, generator=g)
        data[BF16_CURR] = prev + 0.2 * torch.randn(rows, seq, generator=g)
    return data


def _curr(data: dict, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        data["prev_logprobs"][:, 1:]
        + 0.3 * torch.randn(data["prev_logprobs"][:, 1:].shape, generator=g)
    ).requires_grad_()


def _call(loss, data, curr):
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    return loss(
        next_token_logprobs=curr,
        data=data,
        global_valid_seqs=data["sample_mask"].sum(),
        global_valid_toks=mask.sum(),
    )


def test_without_shadow_keys_equals_the_project_loss() -> None:
    data, cfg = _batch(shadow=False), _cfg()
    curr = _curr(data)
    ours, ref = (
        _call(NemoCalibratedLoss(cfg), data, curr),
        _call(CalibratedClippedPGLoss(cfg), data, curr),
    )
    torch.testing.assert_close(ours[0], ref[0])
    assert ours[1] == ref[1]


def test_shadow_batch_returns_the_statistics_the_project_loss_would_observe() -> None:
    """Recorded, shipped and replayed == the project loss observing in-process ([B, S-1] key)."""
    data, cfg = _batch(), _cfg()
    curr = _curr(data)
    loss, metrics = _call(NemoCalibratedLoss(cfg), data, curr)
    payload = metrics.pop(PAYLOAD_KEY)
    assert isinstance(payload, ShadowObservations) and len(payload) == 1
    assert payload.num_tokens == int((data["token_mask"][:, 1:]).sum())

    ref_loss = CalibratedClippedPGLoss(cfg)
    ref_data = dict(data, **{BF16_CURR: data[BF16_CURR][:, 1:]})
    ref_out, ref_metrics = _call(ref_loss, ref_data, curr)
    torch.testing.assert_close(loss, ref_out)
    assert metrics == ref_metrics
    driver = Calibrator(CalibrationConfig(**cfg["calibration"]), 0.2, 0.2)
    payload.replay(driver)
    ours, expected = driver.update(0), ref_loss.calibrator.update(0)
    assert ours.keys() == expected.keys()
    for key in ours:
        assert ours[key] == pytest.approx(expected[key], nan_ok=True), key


def test_worker_side_calibrator_is_left_untouched() -> None:
    loss = NemoCalibratedLoss(_cfg())
    data = _batch()
    _call(loss, data, _curr(data))
    assert not isinstance(loss.calibrator, ObservationRecorder)
    assert loss.calibrator.update(0)["calib_skipped"] == 1.0  # it observed nothing itself


def test_shadow_view_shifts_current_logprobs_and_checks_shapes() -> None:
    data = _batch()
    view = shadow_view(data)
    torch.testing.assert_close(view[BF16_CURR], data[BF16_CURR][:, 1:])
    assert data[BF16_CURR].shape[1] == 7  # the batch itself is not modified
    data[BF16_CURR] = data[BF16_CURR][:, 1:]
    with pytest.raises(
        ValueError, match=r"bf16_curr_logprobs must have the shape of bf16_prev_logprobs"
    ):
        shadow_view(data)
    del data[BF16_PREV]
    with pytest.raises(KeyError, match="needs both"):
        _call(NemoCalibratedLoss(_cfg()), data, _curr(data))


def test_payload_arithmetic_matches_what_nemo_rl_applies_to_metrics() -> None:
    a = ShadowObservations([{"fp8_ratio": torch.ones(3)}])
    b = ShadowObservations([{"fp8_ratio": torch.ones(2)}])
    total = 0
    for value in (a, b):  # SequencePackingLossWrapper: metrics_accum starts at 0, then +=
        total += value
    assert isinstance(total, ShadowObservations) and total.num_tokens == 5
    assert (total / 4) is total  # the Megatron worker divides by the number of global batches
    assert sum([a, b], ShadowObservations()).num_tokens == 5
    with pytest.raises(TypeError):
        _ = a + 1.5


def test_recorder_keeps_only_valid_tokens() -> None:
    cal = Calibrator(CalibrationConfig(enabled=True, min_tokens=1), 0.2, 0.2)
    rec = ObservationRecorder(cal)
    ratio = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    rec.observe(
        fp8_ratio=ratio,
        bf16_ratio=ratio,
        advantages=-ratio,
        weights=None,
        mask=torch.tensor([[1, 0], [0, 1]]),
    )
    (record,) = rec.recorded.records
    assert (
        record["fp8_ratio"].tolist() == [1.0, 4.0]
        and "weights" not in record
        and "mask" not in record
    )
    assert rec.bounds == cal.bounds and rec.cfg is cal.cfg


_CHILD = textwrap.dedent(
    """
    import pickle, sys, torch
    loss = pickle.load(open(sys.argv[1], "rb"))
    data, curr, gs, gt = pickle.load(open(sys.argv[2], "rb"))
    out, metrics = loss(next_token_logprobs=curr, data=data, global_valid_seqs=gs, global_valid_toks=gt)
    out.backward()
    payload = metrics.pop("shadow_observations")
    pickle.dump((out.detach(), metrics, payload, curr.grad, loss.calibrator.bounds,
                 "nemo_rl" in sys.modules), open(sys.argv[3], "wb"))
    """
)


def test_pickled_loss_runs_in_a_separate_process_with_only_the_package(tmp_path) -> None:
    """As in a NeMo RL worker: unpickle, run with moved bounds, send the payload back."""
    loss = NemoCalibratedLoss(_cfg("loss_fn.calibration.init_bounds=[0.7,1.4]"))
    data = _batch()
    curr = _curr(data).detach()
    mask = data["token_mask"][:, 1:]
    args = (data, curr.clone().requires_grad_(), data["sample_mask"].sum(), mask.sum())
    (tmp_path / "loss.pkl").write_bytes(pickle.dumps(loss))
    (tmp_path / "args.pkl").write_bytes(pickle.dumps(args))
    path = [str(REPO)]
    if "nemo_rl" in sys.modules:  # the loss then carries NeMo RL's enums, as in a NeMo RL worker
        path.append(str(Path(sys.modules["nemo_rl"].__path__[0]).parent))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(path),
        "OMP_NUM_THREADS": "1",
    }
    subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            *(str(tmp_path / f) for f in ("loss.pkl", "args.pkl", "out.pkl")),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    out, metrics, payload, grad, bounds, imported_nemo_rl = pickle.loads(
        (tmp_path / "out.pkl").read_bytes()
    )
    ref_curr = curr.clone().requires_grad_()
    ref_out, ref_metrics = _call(loss, data, ref_curr)
    ref_out.backward()
    ref_metrics.pop(PAYLOAD_KEY)
    assert bounds == (0.7, 1.4)
    torch.testing.assert_close(out, ref_out.detach())
    torch.testing.assert_close(grad, ref_curr.grad)
    assert metrics == pytest.approx(ref_metrics)
    assert payload.num_tokens == int(mask.sum())
    assert imported_nemo_rl == ("nemo_rl" in sys.modules)
