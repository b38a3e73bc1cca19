"""The named CPU shim megatron-core and NeMo RL need inside the CPU policy worker's process.

megatron-core 0.19.2 and NeMo RL's refit stream assume a CUDA device in places a CPU run
reaches; each entry below is the smallest change that lets that code run on the CPU, with the
measured reason. Nothing else is patched, and `install()` is called only inside the worker
process (the Ray actor, or a test that builds the worker in-process):

* `torch.cuda.current_device()` returns `"cpu"`: megatron-core passes it as a `device=` in
  ~200 places (rotary embeddings, DDP's grad buffers, the optimizer); without a CUDA driver it
  raises `RuntimeError: Found no NVIDIA driver on your system`;
* `torch.cuda.current_stream()` returns a stream whose `synchronize()` does nothing: NeMo RL's
  `stream_weights_via_ipc_zmq_impl` synchronizes it before every handle (CPU copies are
  already complete when they return);
* the CUDA RNG tracker's `fork()` is a null context: megatron-core's attention forks it around
  dropout and it needs CUDA RNG state (`torch.cuda.get_rng_state`) that does not exist here;
* `cpu_devices()`: a torch function mode that maps `device="cuda"` arguments to the CPU and
  makes `Tensor.cuda()` the identity, entered around megatron-core calls that allocate on
  `device='cuda'` literally: DDP's and the optimizer's construction and step
  (`torch.tensor([1.0], device='cuda')` in `FP32Optimizer.__init__`), `forward_backward_func`
  (`total_num_tokens` in `forward_backward_no_pipelining`) and `finalize_model_grads`.

* `cpu_streams()`: `torch.cuda.Stream()` makes a `CpuStream` and `torch.cuda.stream(s)` is a
  null context, entered around NeMo RL's `packed_broadcast_producer` / `_consumer` (the
  non-colocated refit), which double-buffer on CUDA side streams.

Gradient clipping is not shimmed: `clip_grads.clip_grad_by_total_norm_fp32` asserts
`param.grad.type() == 'torch.cuda.FloatTensor'`, so the worker builds the optimizer with
`clip_grad=0` and clips itself (`optim.clip_main_grads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_INSTALLED: dict[str, Any] = {}


class CpuStream:
    """`torch.cuda.current_stream()` on the CPU: work is synchronous already."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: Any) -> None:
        return None


def _cpu_device() -> str:
    return "cpu"


@contextlib.contextmanager
def cpu_stream() -> Iterator[None]:
    """`torch.cuda.current_stream()` answers a `CpuStream` for the duration (the generation
    worker's refit: NeMo RL v0.7.0's `update_weights_via_ipc_zmq` fences the CUDA stream inline,
    where main calls `_synchronize_before_ipc_data_ack`)."""
    saved = torch.cuda.current_stream
    torch.cuda.current_stream = lambda *a, **k: CpuStream()  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_stream = saved  # type: ignore[assignment]


@contextlib.contextmanager
def cpu_streams() -> Iterator[None]:
    """CUDA side streams as `CpuStream`s, `torch.cuda.stream(...)` a null context, and the
    device arguments of `cpu_devices()`, for the duration (see the module docstring)."""
    saved = torch.cuda.Stream, torch.cuda.stream
    torch.cuda.Stream = lambda *a, **k: CpuStream()  # type: ignore[assignment,misc]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    try:
        with cpu_stream(), cpu_devices():
            yield
    finally:
        torch.cuda.Stream, torch.cuda.stream = saved  # type: ignore[misc]


def install() -> None:
    """Apply the three process-wide entries above (idempotent)."""
    if _INSTALLED:
        return
    import megatron.core.tensor_parallel.random as mrandom

    tracker = mrandom.get_cuda_rng_tracker()
    _INSTALLED.update(
        current_device=torch.cuda.current_device,
        current_stream=torch.cuda.current_stream,
        fork=tracker.fork,
    )
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *a, **k: CpuStream()  # type: ignore[assignment]
    tracker.fork = lambda name=None: contextlib.nullcontext()  # type: ignore[method-assign]


def installed() -> bool:
    return bool(_INSTALLED)


def uninstall() -> None:
    """Undo `install()` (for a test process that builds workers in-process)."""
    if not _INSTALLED:
        return
    import megatron.core.tensor_parallel.random as mrandom

    torch.cuda.current_device = _INSTALLED.pop("current_device")  # type: ignore[assignment]
    torch.cuda.current_stream = _INSTALLED.pop("current_stream")  # type: ignore[assignment]
    mrandom.get_cuda_rng_tracker().fork = _INSTALLED.pop("fork")  # type: ignore[method-assign]


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True  # a bare index means a CUDA device
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class _CudaToCpu(TorchFunctionMode):
    """`device="cuda"` → CPU for every torch call; `Tensor.cuda()` → the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_devices() -> Iterator[None]:
    """Run the block with CUDA device arguments mapped to the CPU (see the module docstring)."""
    with _CudaToCpu():
        yield
