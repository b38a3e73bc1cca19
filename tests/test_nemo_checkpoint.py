"""Calibrator state in NeMo RL checkpoint folders: round trip, absence, corruption, mismatch."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_fp8_rl.calibration import Calibrator
from nemo_fp8_rl.config.project import CalibrationConfig
from nemo_fp8_rl.engines.nemo.driver.checkpoint import (
    CALIBRATOR_FILE,
    load_calibrator_state,
    save_calibrator_state,
)

torch.set_num_threads(1)


def _calibrated() -> Calibrator:
    """A calibrator after one real update on noisy ratios (bounds moved, NaN-bearing history)."""
    cal = Calibrator(CalibrationConfig(enabled=True, interval=5, min_tokens=16), 0.2, 0.28)
    g = torch.Generator().manual_seed(0)
    bf16 = torch.exp(0.1 * torch.randn(512, generator=g))
    fp8 = bf16 * torch.exp(0.15 * torch.randn(512, generator=g))
    adv = torch.where(torch.arange(512) % 2 == 0, 1.0, -1.0)
    cal.observe(fp8_ratio=fp8, bf16_ratio=bf16, advantages=adv)
    cal.update(0)
    cal.history[-1]["prob_nmae_probe"] = math.nan
    return cal


def test_round_trip_restores_bounds_step_and_history(tmp_path) -> None:
    cal = _calibrated()
    assert cal.bounds != cal.nominal
    path = save_calibrator_state(cal, tmp_path / "step_5")
    assert path == tmp_path / "step_5" / CALIBRATOR_FILE
    assert not list((tmp_path / "step_5").glob("*.tmp"))
    fresh = Calibrator(CalibrationConfig(enabled=True, interval=5, min_tokens=16), 0.2, 0.28)
    assert load_calibrator_state(fresh, tmp_path / "step_5")
    assert fresh.bounds == cal.bounds
    assert fresh.last_calibration_step == 0
    assert fresh.history[-1].keys() == cal.history[-1].keys()
    assert math.isnan(fresh.history[-1]["prob_nmae_probe"])
    assert fresh.state_dict()["bounds"] == cal.state_dict()["bounds"]


def test_checkpoint_without_state_keeps_initial_bounds(tmp_path) -> None:
    cal = Calibrator(CalibrationConfig(enabled=True), 0.2, 0.2)
    assert not load_calibrator_state(cal, tmp_path)
    assert not load_calibrator_state(cal, None)
    assert cal.bounds == (0.8, 1.2)


def test_corrupt_file_names_the_file(tmp_path) -> None:
    (tmp_path / CALIBRATOR_FILE).write_text("{not json")
    cal = Calibrator(CalibrationConfig(enabled=True), 0.2, 0.2)
    with pytest.raises(ValueError, match=CALIBRATOR_FILE):
        load_calibrator_state(cal, tmp_path)


def test_other_nominal_bounds_are_refused(tmp_path) -> None:
    save_calibrator_state(_calibrated(), tmp_path)
    other = Calibrator(CalibrationConfig(enabled=True, interval=5, min_tokens=16), 0.2, 0.2)
    with pytest.raises(ValueError, match="nominal bounds"):
        load_calibrator_state(other, tmp_path)
