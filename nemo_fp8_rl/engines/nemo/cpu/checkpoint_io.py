"""The CPU policy worker's checkpoint files, written atomically, read back at construction.

`save_checkpoint(weights_path, optimizer_path)` (NeMo RL's arguments: directories inside its
`tmp_step_N/policy/`) writes

    <weights_path>/model.pt       the Megatron model's state dict (FP32 master weights)
    <optimizer_path>/optim.pt     megatron-core optimizer and LR-scheduler state dicts

each to a temporary sibling first (`.<name>.<random>.tmp`, created with O_EXCL), flushed and fsynced, then renamed
over the final name, so a reader never sees a partial file. NeMo RL's `Policy` passes the
same two paths to the worker's constructor on resume; `load_*` read them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.safe_files import write_atomic_with
from nemo_fp8_rl.config.user_error import UserError

MODEL_FILE = "model.pt"
OPTIM_FILE = "optim.pt"


def atomic_save(obj: Any, path: Path) -> None:
    """`torch.save(obj)` to `path` through a temporary sibling (created with O_EXCL, never a
    link) and a rename: `safe_files.write_atomic_with`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_with(path, lambda out: torch.save(obj, out))  # safe-write: fd (write_atomic_with)


def save(
    model_state: dict, weights_path: str, optim_state: dict | None, optimizer_path: str | None
):
    """Write the model state (and the optimizer state when a path is given)."""
    atomic_save(model_state, Path(weights_path) / MODEL_FILE)
    if optimizer_path is not None and optim_state is not None:
        atomic_save(optim_state, Path(optimizer_path) / OPTIM_FILE)


def _read(folder: str, name: str, what: str) -> Any:
    path = Path(folder) / name
    if not path.is_file():
        raise UserError(
            f"{what}={folder}",
            f"no {name} in it",
            "pass a folder written by the CPU "
            "policy worker's save_checkpoint (NeMo RL's <checkpoint>/policy/weights|optimizer)",
        )
    return torch.load(path, map_location="cpu", weights_only=False)


def load_model(weights_path: str) -> dict:
    return _read(weights_path, MODEL_FILE, "weights_path")


def load_optim(optimizer_path: str) -> dict:
    return _read(optimizer_path, OPTIM_FILE, "optimizer_path")
