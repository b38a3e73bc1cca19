"""The workers' config path, on CPU: what NeMo RL's vLLM worker would pass to vLLM, and how far
the Megatron worker's config path gets without a GPU.

vLLM worker: NeMo RL's own `VllmGenerationWorkerImpl._init_config` and `_load_model` run on the
generation config `grpo.setup()` handed to `VllmGeneration` (as the Ray worker would receive it),
up to `vllm.LLM(**llm_kwargs)`, where `LLMRecorder` keeps the keyword arguments. Replaced, and
why: `torch.cuda.get_device_capability` (`DeviceCapabilityRecorder`, answers Hopper's 9.0: the
default of `enable_prefix_caching` depends on it); `_apply_vllm_patches` (`PatchRecorder`: it edits the installed vLLM's source files); `vllm`
itself where it is not installed (`vllm_stand_in`: a module holding `LLMRecorder`); and then
`init_fp8` for FP8 rollouts (`Fp8InitRecorder`: NeMo RL's FP8 module imports vLLM internals at
import time), whose quantization arguments are then absent from the recorded kwargs.

Megatron worker: `nemo_rl/models/megatron/setup.py` (which turns `policy.megatron_cfg` into
Megatron-Bridge's model provider and optimizer config) is imported; where its import chain needs
CUDA (Megatron-Bridge imports Transformer Engine) the reason is reported as a part not run.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight.located import nemo_rl_frame, relative_file
from nemo_fp8_rl.engines.nemo.preflight.recorders import Recorder, installed

FP8_MODULE = "nemo_rl.models.generation.vllm.quantization.fp8"


class LLMRecorder(Recorder):
    """`vllm.LLM`: keeps the keyword arguments the worker builds (`kwargs`)."""


class PatchRecorder(Recorder):
    """`_apply_vllm_patches(py_executable, extra_env_vars=...)`: records, edits nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._record("_apply_vllm_patches", *args, **kwargs)


class DeviceCapabilityRecorder(Recorder):
    """`torch.cuda.get_device_capability()`: answers 9.0 (Hopper, the recipes' target GPU)."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        self._record("get_device_capability", *args, **kwargs)
        return (9, 0)


class Fp8InitRecorder(Recorder):
    """`init_fp8(vllm_cfg, model_name, model_parallel_size)`: records, returns no FP8 kwargs."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        self._record("init_fp8", *args, **kwargs)
        return {}


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
def vllm_stand_in(not_run: list[str]) -> Iterator[type[LLMRecorder]]:
    """Real vLLM with `LLM` recorded if importable; otherwise a `vllm` module of recorders."""
    recorder = type("LLMRecorder", (LLMRecorder,), {})
    if importlib.util.find_spec("vllm") is not None:
        import vllm

        with installed([(vllm, "LLM", recorder)]):
            yield recorder
        return
    vllm_mod = types.ModuleType("vllm")
    vllm_mod.LLM, vllm_mod.SamplingParams = recorder, Recorder
    log_mod = types.ModuleType("vllm.logger")
    log_mod.init_logger = logging.getLogger
    vllm_mod.logger = log_mod
    fp8 = types.ModuleType(FP8_MODULE)
    fp8.init_fp8 = Fp8InitRecorder()
    added = {"vllm": vllm_mod, "vllm.logger": log_mod}
    if importlib.util.find_spec(FP8_MODULE) is not None and FP8_MODULE not in sys.modules:
        added[FP8_MODULE] = fp8
    sys.modules.update(added)
    try:
        yield recorder
    finally:
        for name in added:
            sys.modules.pop(name, None)
        if fp8.init_fp8.calls:
            not_run.append(
                f"{FP8_MODULE.replace('.', '/')}.py init_fp8: imports vLLM internals "
                "(vllm.model_executor...) at import and vLLM is not installed here; the FP8 "
                "arguments it adds to LLM(...) (quantization, hf_overrides.quantization_config) "
                "were not built"
            )


def rehearse_vllm_worker(config: dict[str, Any], seed: int, not_run: list[str]) -> dict[str, Any]:
    """Run the vLLM worker's config path on `config`; returns the kwargs of `vllm.LLM(...)`."""
    from nemo_rl.models.generation.vllm import vllm_worker

    cls = vllm_worker.VllmGenerationWorkerImpl
    worker = cls.__new__(cls)
    vcfg = config["vllm_cfg"]
    bundle = list(range(vcfg["tensor_parallel_size"] * vcfg["pipeline_parallel_size"]))
    with (
        vllm_stand_in(not_run) as llm,
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
    assert isinstance(getattr(worker, "llm", None), llm), "the vLLM worker built no vllm.LLM"
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
