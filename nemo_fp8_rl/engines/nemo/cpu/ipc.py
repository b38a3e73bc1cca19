"""CPU replacement for the CUDA IPC handles inside NeMo RL's ZeroMQ refit stream.

NeMo RL's `stream_weights_via_ipc_zmq_impl` packs weights into a staging buffer and sends
`get_handle_from_tensor(buffer)` over ZeroMQ; the receiver rebuilds the buffer with
`rebuild_cuda_tensor_from_ipc(handle, device_index)`. Both are CUDA-only. Here the buffer is
copied into a named file in shared memory (`/dev/shm` where it exists) and the handle is
`("cpu-shm", path, nbytes)`; the receiver maps that file. Everything else in the stream
(chunking, ping-pong buffers, the REQ/REP handshake, the receiver's checks) is NeMo RL's.

`install()` binds the two functions in the NeMo RL modules that imported them; it is called
inside the worker processes only.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

TAG = "cpu-shm"


def _shm_dir() -> Path:
    """Where staging files live: /dev/shm (RAM-backed) when present, else the temp folder."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    folder = base / f"nemo-fp8-rl-refit-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def handle_from_tensor(buffer: torch.Tensor) -> tuple[str, str, int]:
    """Copy a uint8 staging buffer into a fresh shared-memory file; its handle names it."""
    flat = buffer.detach().reshape(-1).view(torch.uint8).cpu()
    path = _shm_dir() / f"{uuid.uuid4().hex}.buf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:  # safe-write: fd (O_EXCL | O_NOFOLLOW)
        out.write(flat.numpy().tobytes())
    return (TAG, str(path), int(flat.numel()))


def rebuild_from_handle(handle: Any, device_index: Any = None) -> torch.Tensor:
    """The buffer a handle names, read into memory; the file is removed once read."""
    tag, path, nbytes = handle
    if tag != TAG:
        raise ValueError(f"refit stream: handle {handle!r} is not a {TAG} handle")
    data = Path(path).read_bytes()
    os.unlink(path)
    if len(data) != nbytes:
        raise ValueError(f"refit stream: {path} holds {len(data)} bytes, the handle says {nbytes}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def install() -> None:
    """Bind the CPU handle functions where NeMo RL's refit modules look them up."""
    from nemo_rl.models.policy import utils as policy_utils

    policy_utils.get_handle_from_tensor = handle_from_tensor
    try:
        from nemo_rl.models.generation.vllm import vllm_backend
    except ImportError:  # vLLM's modules need the stand-in; the generation worker installs it
        return
    vllm_backend.rebuild_cuda_tensor_from_ipc = rebuild_from_handle
