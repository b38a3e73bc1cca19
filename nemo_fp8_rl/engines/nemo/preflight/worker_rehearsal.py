"""The workers' config path, on CPU: what NeMo RL's vLLM worker would pass to vLLM, and how far
the Megatron worker's config path gets without a GPU.

vLLM worker: NeMo RL's own `VllmGenerationWorkerImpl._init_config` and `_load_model` run on the
generation config the real `VllmGeneration` handed to its worker builder, up to
`vllm.LLM(**llm_kwargs)`, where `LLMRecorder` keeps the keyword arguments. For FP8 rollouts that
includes NeMo RL's real `init_fp8` (its FP8 validation and the `quantization` /
`hf_overrides.quantization_config` arguments it adds). What is replaced, and why, is `STOOD_IN`.

Megatron worker: `nemo_rl/models/megatron/setup.py` (which turns `policy.megatron_cfg` into
Megatron-Bridge's model provider and optimizer config) is imported; where its import chain needs
CUDA (Megatron-Bridge imports Transformer Engine) the reason is reported as a part not run.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight.located import nemo_rl_frame, relative_file
from nemo_fp8_rl.engines.nemo.preflight.recorders import Recorder, StandIn, installed
from nemo_fp8_rl.engines.nemo.preflight.stand_in_modules import LLMRecorder, vllm_stand_in

STOOD_IN = (
    StandIn(
        "nemo_rl...vllm_worker._apply_vllm_patches",
        "PatchRecorder",
        "edits the installed vLLM's source files",
    ),
    StandIn(
        "torch.cuda.get_device_capability",
        "DeviceCapabilityRecorder",
        "answers 9.0 (Hopper): the default of `enable_prefix_caching` depends on it",
    ),
    StandIn(
        "vllm (where not installed)",
        "stand_in_modules.vllm_stand_in",
        "a CUDA build; NeMo RL's FP8 module imports its internals at import time (init_fp8 itself runs)",
    ),
    StandIn(
        "vllm.LLM",
        "LLMRecorder",
        "starts the engine; the recorded arguments go through vLLM's checks (vllm_checks)",
    ),
)


class PatchRecorder(Recorder):
    """`_apply_vllm_patches(py_executable, extra_env_vars=...)`: records, edits nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._record("_apply_vllm_patches", *args, **kwargs)


class DeviceCapabilityRecorder(Recorder):
    """`torch.cuda.get_device_capability()`: answers 9.0 (Hopper, the recipes' target GPU)."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        self._record("get_device_capability", *args, **kwargs)
        return (9, 0)


@contextlib.contextmanager
def _saved_environ() -> Iterator[None]:
    """The worker sets process environment variables for vLLM; undo them afterwards."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _vllm(not_run: list[str]) -> Iterator[None]:
    """The machine's vLLM with `LLM` recorded if installed; otherwise the stand-in package."""
    if importlib.util.find_spec("vllm") is None:
        with vllm_stand_in():
            yield
        return
    import vllm

    with _fresh_fp8_module(), installed([(vllm, "LLM", LLMRecorder)]):
        yield


FP8_PACKAGE = "nemo_rl.models.generation.vllm.quantization"


@contextlib.contextmanager
def _fresh_fp8_module() -> Iterator[None]:
    """Where vLLM is installed, NeMo RL's FP8 module as a fresh copy for the rehearsal: its
    `init_fp8` sets module globals and patches vLLM's classes once per process (`assert not
    fp8_patches_applied`, fp8.py), so a second rehearsal in one process (several recipes) would
    stop there. Afterwards the patches the copy applied to the real vLLM are stopped and the
    process's own modules are put back (the stand-in path does the same: `stood_in`)."""
    mine = lambda name: name == FP8_PACKAGE or name.startswith(FP8_PACKAGE + ".")  # noqa: E731
    hidden = {n: m for n, m in sys.modules.items() if mine(n)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        fresh = sys.modules.get(FP8_PACKAGE + ".fp8")
        for patcher in list(getattr(getattr(fresh, "fp8_state", None), "vllm_patches", [])):
            with contextlib.suppress(RuntimeError):
                patcher.stop()
        for name in [n for n in sys.modules if mine(n)]:
            del sys.modules[name]
        sys.modules.update(hidden)
        for name, module in hidden.items():  # parents point at the modules put back
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, module)


def rehearse_vllm_worker(config: dict[str, Any], seed: int, not_run: list[str]) -> dict[str, Any]:
    """Run the vLLM worker's config path on `config`; returns the kwargs of `vllm.LLM(...)`."""
    from nemo_rl.models.generation.vllm import vllm_worker

    cls = vllm_worker.VllmGenerationWorkerImpl
    worker = cls.__new__(cls)
    vcfg = config["vllm_cfg"]
    bundle = list(range(vcfg["tensor_parallel_size"] * vcfg["pipeline_parallel_size"]))
    with (
        _vllm(not_run),
        installed(
            [
                (vllm_worker, "_apply_vllm_patches", PatchRecorder()),
                (vllm_worker.torch.cuda, "get_device_capability", DeviceCapabilityRecorder()),
            ]
        ),
        _saved_environ(),
    ):
        worker._init_config(config, bundle, 1.0, seed, None)
        worker._load_model(bundle, seed)
    assert isinstance(getattr(worker, "llm", None), LLMRecorder), (
        "the vLLM worker built no vllm.LLM"
    )
    return copy.deepcopy(worker.llm.kwargs)


def rehearse_megatron_worker(not_run: list[str]) -> bool:
    """Import the Megatron worker's config module; False (reason in `not_run`) if it cannot."""
    try:
        import nemo_rl.models.megatron.setup  # noqa: F401
    except ImportError as exc:
        hit = nemo_rl_frame(exc.__traceback__)
        where = f"{relative_file(hit[0].f_code.co_filename)}:{hit[1]}" if hit else "?"
        not_run.append(
            f"nemo_rl/models/megatron/setup.py (policy.megatron_cfg -> Megatron model, optimizer "
            f"and DDP configs): its import at {where} fails here: {exc}. It needs Megatron-Bridge, "
            "whose import needs Transformer Engine (megatron-bridge 0.6.2 from PyPI: "
            "megatron/bridge/peft/lora_layers.py imports transformer_engine.pytorch), a CUDA "
            "library; the keys it reads are held against NeMo RL's exemplar configs instead"
        )
        return False
    not_run.append(
        "nemo_rl/models/megatron/setup.py imports here, but its config functions build the model "
        "provider from a checkpoint and initialise torch.distributed; not rehearsed"
    )
    return True
