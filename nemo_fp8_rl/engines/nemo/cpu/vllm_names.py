"""The vLLM names NeMo RL's vLLM-side refit code imports, for a process without vLLM.

vLLM is a CUDA build and is not installed where the CPU loop runs. NeMo RL's
`quantization/fp8.py` and `vllm_backend.py` import a few vLLM names at import time (layer
classes to test with `isinstance`, a Triton namespace, engine classes they patch later) and a
few inside the refit functions (`set_current_vllm_config`, `process_weights_after_loading`, the
methods `apply_fp8_patches` patches). This module provides modules holding only those names:

* `install()` puts them into `sys.modules` for good: the CPU generation worker's process
  (a Ray actor of its own) imports NeMo RL's vLLM modules against them;
* `installed()` does so for a block and removes everything imported meanwhile (NeMo RL's
  modules too), so tests in one process see the machine as it is afterwards.

Nothing NeMo RL computes is replaced: its `load_weights`, `_is_fp8_weight`,
`cast_tensor_to_fp8_blockwise`, `quantize_mxfp8_weight`, `init_fp8`, `update_weights_*` and
packing code run as shipped. The one vLLM function NeMo RL's refit computes with, MXFP8's
`mxfp8_e4m3_quantize` (`vllm_cfg.is_mx`), is the project's bit-exact replica of vLLM's CPU path
(`refit.nemo_mxfp8.mxfp8_quantize_like_vllm`, held against vLLM in the vLLM environment).
`process_weights_after_loading` (vLLM's kernel-layout step) counts its calls and runs the
served model's own `process_weights_after_loading()` where the model has one (the CPU served
model commits a refit there).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UserError


class LinearBase(torch.nn.Module):
    """vLLM's `LinearBase`: NeMo RL tests `isinstance` and `weight.dtype` (FP8 when quantized)."""


class RoutedExperts(torch.nn.Module):
    """vLLM's `FusedMoE` (v0.7.0's vLLM) / `RoutedExperts` (7ea279a's): holds w13/w2 weights."""


class MoERunner(torch.nn.Module):
    """vLLM 0.25's `MoERunner` (7ea279a): delegates to `routed_experts`."""


class Fp8Config:
    """vLLM's block `Fp8Config` (`is_fp8_model` tests `isinstance` and `weight_block_size`)."""

    weight_block_size = [128, 128]


class ModelOptMxFp8Config:
    """vLLM's ModelOpt MXFP8 config (`vllm_cfg.is_mx`; 7ea279a's `is_fp8_model` accepts it)."""


class EngineCoreProc:
    """vLLM's `EngineCoreProc`: NeMo RL keeps a reference to `run_engine_core` at import."""

    @staticmethod
    def run_engine_core(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("vLLM names stand-in: no vLLM engine runs here")


class CoreEngineProcManager:
    """vLLM's `CoreEngineProcManager`: NeMo RL keeps a reference to `__init__` at import."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("vLLM names stand-in: no vLLM engine runs here")


class _PatchTarget:
    """A vLLM quantization method class whose `process_weights_after_loading` NeMo RL's
    `apply_fp8_patches` replaces (with `unittest.mock.patch`); nothing here calls it."""

    def process_weights_after_loading(self, layer: Any) -> None:
        raise RuntimeError("vLLM names stand-in: no vLLM quantization method runs here")


class Fp8LinearMethod(_PatchTarget):
    """vLLM's `Fp8LinearMethod` (a patch target of `apply_fp8_patches`)."""


class Fp8MoEMethod(_PatchTarget):
    """vLLM's `Fp8MoEMethod` (a patch target of `apply_fp8_patches`)."""


class BaseKVCacheMethod(_PatchTarget):
    """vLLM's `BaseKVCacheMethod` (a patch target of `apply_fp8_patches`)."""


class ModelOptMxFp8LinearMethod(_PatchTarget):
    """vLLM's ModelOpt MXFP8 linear method (a patch target of `apply_fp8_patches` with is_mx)."""


class ModelOptMxFp8FusedMoE(_PatchTarget):
    """vLLM's ModelOpt MXFP8 MoE method (patch targets of `apply_fp8_patches` with is_mx)."""

    def create_weights(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("vLLM names stand-in: no vLLM quantization method runs here")


def mxfp8_e4m3_quantize(
    x: torch.Tensor, is_sf_swizzled_layout: bool = False, alignment: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `mxfp8_e4m3_quantize` on its CPU path (non-swizzled; `refit.nemo_mxfp8`)."""
    from nemo_fp8_rl.refit.nemo_mxfp8 import mxfp8_quantize_like_vllm

    if is_sf_swizzled_layout:
        raise RuntimeError("vLLM names stand-in: the swizzled MXFP8 scale layout is GPU-only")
    return mxfp8_quantize_like_vllm(x, what="mxfp8_e4m3_quantize input")


def _no_vllm_kernel(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("vLLM names stand-in: no vLLM kernel runs here")


class ProcessAfterLoading:
    """vLLM's `process_weights_after_loading(model, model_config, device)`: counts the calls
    and runs `model.process_weights_after_loading()` where the model defines it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, model: Any = None, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        hook = getattr(model, "process_weights_after_loading", None)
        if callable(hook):
            hook()


def _names(after_loading: ProcessAfterLoading) -> dict[str, dict[str, Any]]:
    """The vLLM modules and names NeMo RL's refit code imports (both snapshots)."""
    import triton
    import triton.language as tl

    return {
        "vllm": {},
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.config": {"set_current_vllm_config": lambda *a, **k: contextlib.nullcontext()},
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.core": {"EngineCoreProc": EngineCoreProc},
        "vllm.v1.engine.utils": {"CoreEngineProcManager": CoreEngineProcManager},
        "vllm.v1.worker": {},
        "vllm.v1.worker.gpu_worker": {"Worker": type("StandInWorker", (), {})},
        "vllm.distributed": {},
        "vllm.distributed.parallel_state": {"get_pp_group": lambda: None},
        "vllm.model_executor": {},
        "vllm.model_executor.model_loader": {},
        "vllm.model_executor.model_loader.utils": {"process_weights_after_loading": after_loading},
        "vllm.model_executor.layers": {},
        "vllm.model_executor.layers.linear": {"LinearBase": LinearBase},
        "vllm.model_executor.layers.fused_moe": {},
        "vllm.model_executor.layers.fused_moe.layer": {"FusedMoE": RoutedExperts},
        "vllm.model_executor.layers.fused_moe.routed_experts": {"RoutedExperts": RoutedExperts},
        "vllm.model_executor.layers.fused_moe.runner": {},
        "vllm.model_executor.layers.fused_moe.runner.moe_runner": {"MoERunner": MoERunner},
        "vllm.model_executor.layers.quantization": {},
        "vllm.model_executor.layers.quantization.fp8": {
            "Fp8Config": Fp8Config,
            "Fp8LinearMethod": Fp8LinearMethod,
            "Fp8MoEMethod": Fp8MoEMethod,
        },
        "vllm.model_executor.layers.quantization.kv_cache": {
            "BaseKVCacheMethod": BaseKVCacheMethod
        },
        "vllm.model_executor.layers.quantization.modelopt": {
            "ModelOptMxFp8Config": ModelOptMxFp8Config,
            "ModelOptMxFp8LinearMethod": ModelOptMxFp8LinearMethod,
            "ModelOptMxFp8FusedMoE": ModelOptMxFp8FusedMoE,
        },
        "vllm.model_executor.layers.quantization.utils": {},
        "vllm.model_executor.layers.quantization.utils.mxfp8_utils": {
            "mxfp8_e4m3_quantize": mxfp8_e4m3_quantize,
            "MXFP8_VALUE_DTYPE": torch.float8_e4m3fn,
            "MXFP8_SCALE_DTYPE": torch.uint8,
            "MXFP8_BLOCK_SIZE": 32,
        },
        "vllm.model_executor.layers.quantization.utils.fp8_utils": {
            name: _no_vllm_kernel
            for name in (
                "per_token_group_quant_fp8",
                "_per_token_group_quant_fp8",
                "_per_token_group_quant_fp8_colmajor",
            )
        },
    }


def _modules(after_loading: ProcessAfterLoading) -> dict[str, types.ModuleType]:
    out = {}
    for name, attrs in _names(after_loading).items():
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so submodules resolve
        module.__dict__.update(attrs)
        out[name] = module
    return out


def vllm_installed() -> bool:
    """Whether a real vLLM is importable here."""
    if is_installed():
        return False
    return "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None


def is_installed() -> bool:
    """Whether this module's names are the `vllm` in `sys.modules`."""
    return getattr(sys.modules.get("vllm"), "__nemo_fp8_rl_stand_in__", False)


def install() -> ProcessAfterLoading:
    """Put the names into `sys.modules` for the rest of the process (idempotent); returns the
    `process_weights_after_loading` in use. Refuses when a real vLLM was already imported."""
    if is_installed():
        return sys.modules["vllm.model_executor.model_loader.utils"].process_weights_after_loading
    if "vllm" in sys.modules:
        raise UserError(
            "vllm_names.install",
            "a real vLLM is already imported in this process",
            "run the CPU generation worker in a process of its own (a Ray actor)",
        )
    import triton.language  # noqa: F401  (real Triton, imported before the names go in)

    after_loading = ProcessAfterLoading()
    modules = _modules(after_loading)
    modules["vllm"].__nemo_fp8_rl_stand_in__ = True
    sys.modules.update(modules)
    return after_loading


@contextlib.contextmanager
def installed() -> Iterator[ProcessAfterLoading]:
    """The names in `sys.modules` inside the block; on exit every module imported meanwhile is
    removed. Refuses where a real vLLM is installed (run against it instead)."""
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        raise RuntimeError("vLLM is installed here: run these tests against it, not stand-ins")
    import triton.language  # noqa: F401  (real Triton, imported before the snapshot: it stays)

    before = set(sys.modules)
    after_loading = install()
    try:
        yield after_loading
    finally:
        _forget(set(sys.modules) - before)


def _forget(names: set[str]) -> None:
    """Remove modules `names`, and their attributes on parent packages that stay (else a later
    `from package import module` finds the removed module there instead of importing anew)."""
    removed = {name: sys.modules.pop(name) for name in names}
    for name, module in removed.items():
        parent_name, _, child = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is not None and getattr(parent, child, None) is module:
            delattr(parent, child)
