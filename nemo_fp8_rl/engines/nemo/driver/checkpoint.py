"""Calibrator state inside NeMo RL checkpoints.

NeMo RL writes each checkpoint into a temporary `step_<k>` folder (policy weights under
`policy/weights`, optimizer, dataloader state, `training_info.json`) and renames it when the
save completes. The calibrator's state (bounds in force, last calibration step, history) is
written into that same folder as `calibrator_state.json` before the policy's own save, so it
is renamed with the rest and a checkpoint either has all of it or is not used. On resume the
engine reads it from the folder NeMo RL resumes from (`CheckpointManager.get_latest_checkpoint_path`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import write_atomic

CALIBRATOR_FILE = "calibrator_state.json"


def _json_safe(value: Any) -> Any:
    """NaN/inf floats (calibration statistics can be NaN) as strings JSON can hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def save_calibrator_state(calibrator: Any, checkpoint_dir: Path) -> Path:
    """Write `calibrator.state_dict()` atomically to `<checkpoint_dir>/calibrator_state.json`."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / CALIBRATOR_FILE
    write_atomic(path, json.dumps(_json_safe(calibrator.state_dict()), indent=1))
    return path


def load_calibrator_state(calibrator: Any, checkpoint_dir: str | Path | None) -> bool:
    """Restore the calibrator from a checkpoint folder; False when there is nothing to restore.

    A checkpoint without the file (one written by an uncalibrated run) leaves the calibrator
    at its initial bounds. A file that is not valid JSON is a ValueError naming the file.
    """
    if checkpoint_dir is None:
        return False
    path = Path(checkpoint_dir) / CALIBRATOR_FILE
    if not path.is_file():
        return False
    try:
        state = _from_json(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not valid JSON ({exc}); delete the checkpoint or fix the file"
        ) from None
    calibrator.load_state_dict(state)
    return True
