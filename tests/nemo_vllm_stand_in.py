"""Named CPU stand-ins for the vLLM pieces NeMo RL's vLLM-side refit code imports.

vLLM is a CUDA build and is not installed in the contract environment. NeMo RL's
`quantization/fp8.py` and `vllm_backend.py` import a few vLLM names at import time (layer
classes to test with `isinstance`, a Triton namespace, engine classes they patch later) and a
few inside the refit functions (`set_current_vllm_config`, `process_weights_after_loading`).
`installed_vllm_stand_in()` puts modules holding only those names into `sys.modules`, imports
NeMo RL's modules against them, and removes everything it added afterwards (NeMo RL's modules
too), so other tests see the machine as it is. Nothing NeMo RL computes is replaced: its
`load_weights`, `_is_fp8_weight`, `cast_tensor_to_fp8_blockwise`, `update_weights_*` and
packing code run as shipped.

`RecordingModel` is the vLLM model: a module tree shaped like vLLM's Qwen3 or Qwen3-MoE (fused
`qkv_proj` and `gate_up_proj` through `packed_modules_mapping`, router and fused experts, FP8 or
BF16 per layer) whose `load_weights` records each call's (name, tensor) list.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

FP8 = torch.float8_e4m3fn


class StandInLinearBase(torch.nn.Module):
    """vLLM's `LinearBase`: NeMo RL tests `isinstance` and `weight.dtype` (FP8 when quantized)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, 1, dtype=dtype), requires_grad=False)


class StandInRoutedExperts(torch.nn.Module):
    """vLLM's `FusedMoE` (v0.7.0's vLLM) / `RoutedExperts` (7ea279a's): holds w13/w2 weights."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.empty(1, 1, 1, dtype=dtype), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.empty(1, 1, 1, dtype=dtype), requires_grad=False)


class StandInMoERunner(torch.nn.Module):
    """vLLM 0.25's `MoERunner` (7ea279a): delegates to `routed_experts`."""


class StandInFp8Config:
    """vLLM's block `Fp8Config` (`is_fp8_model` tests `isinstance` and `weight_block_size`)."""

    weight_block_size = [128, 128]


class StandInEngineCoreProc:
    """vLLM's `EngineCoreProc`: NeMo RL keeps a reference to `run_engine_core` at import."""

    @staticmethod
    def run_engine_core(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stand-in: no vLLM engine runs here")


class StandInCoreEngineProcManager:
    """vLLM's `CoreEngineProcManager`: NeMo RL keeps a reference to `__init__` at import."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stand-in: no vLLM engine runs here")


class ProcessAfterLoadingRecorder:
    """vLLM's `process_weights_after_loading` (kernel layouts; GPU work): records the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1


class RecordingModel(torch.nn.Module):
    """vLLM's model for the refit: Qwen3-shaped module tree; `load_weights` records its calls.

    `fp8_layers[i]` says whether decoder layer i's linear layers are FP8 (vLLM builds the
    `num_first/last_layers_in_bf16` layers unquantized). `calls` holds each `load_weights`
    argument as a list of (name, tensor clone); nothing else is stored anywhere.
    """

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, fp8_layers: list[bool], moe: bool = False) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(
            self._layer(FP8 if fp8 else torch.bfloat16, moe) for fp8 in fp8_layers
        )
        self.model.embed_tokens = torch.nn.Embedding(4, 4)
        self.model.norm = torch.nn.LayerNorm(4)
        self.lm_head = torch.nn.Linear(4, 4, bias=False)
        self.calls: list[list[tuple[str, torch.Tensor]]] = []

    @staticmethod
    def _layer(dtype: torch.dtype, moe: bool) -> torch.nn.Module:
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = StandInLinearBase(dtype)
        layer.self_attn.o_proj = StandInLinearBase(dtype)
        layer.mlp = torch.nn.Module()
        if moe:  # Qwen3-MoE: router (a linear layer built with the quant config) and experts
            layer.mlp.gate = StandInLinearBase(dtype)
            layer.mlp.experts = StandInRoutedExperts(dtype)
        else:
            layer.mlp.gate_up_proj = StandInLinearBase(dtype)
            layer.mlp.down_proj = StandInLinearBase(dtype)
        layer.input_layernorm = torch.nn.LayerNorm(4)
        return layer

    def load_weights(self, weights: Any) -> set[str]:
        """Record the (name, tensor) list vLLM's loader would receive."""
        self.calls.append([(str(n), t.detach().clone()) for n, t in weights])
        return {str(n) for n, _ in self.calls[-1]}


class StandInModelRunner:
    """vLLM's GPU model runner as NeMo RL's extension reads it: `model`, `vllm_config`."""

    def __init__(self, model: RecordingModel, fp8: bool = True) -> None:
        self.model = model
        self.vllm_config = types.SimpleNamespace(
            quant_config=StandInFp8Config() if fp8 else None,
            model_config=types.SimpleNamespace(architectures=["Qwen3ForCausalLM"]),
            cache_config=types.SimpleNamespace(cache_dtype="auto"),
        )


def _modules(recorder: ProcessAfterLoadingRecorder) -> dict[str, types.ModuleType]:
    """The vLLM modules and names NeMo RL's refit code imports (both snapshots)."""
    import triton
    import triton.language as tl

    names: dict[str, dict[str, Any]] = {
        "vllm": {},
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.config": {"set_current_vllm_config": lambda *a, **k: contextlib.nullcontext()},
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.core": {"EngineCoreProc": StandInEngineCoreProc},
        "vllm.v1.engine.utils": {"CoreEngineProcManager": StandInCoreEngineProcManager},
        "vllm.v1.worker": {},
        "vllm.v1.worker.gpu_worker": {"Worker": type("StandInWorker", (), {})},
        "vllm.distributed": {},
        "vllm.distributed.parallel_state": {"get_pp_group": lambda: None},
        "vllm.model_executor": {},
        "vllm.model_executor.model_loader": {},
        "vllm.model_executor.model_loader.utils": {"process_weights_after_loading": recorder},
        "vllm.model_executor.layers": {},
        "vllm.model_executor.layers.linear": {"LinearBase": StandInLinearBase},
        "vllm.model_executor.layers.fused_moe": {},
        "vllm.model_executor.layers.fused_moe.layer": {"FusedMoE": StandInRoutedExperts},
        "vllm.model_executor.layers.fused_moe.routed_experts": {
            "RoutedExperts": StandInRoutedExperts
        },
        "vllm.model_executor.layers.fused_moe.runner": {},
        "vllm.model_executor.layers.fused_moe.runner.moe_runner": {"MoERunner": StandInMoERunner},
        "vllm.model_executor.layers.quantization": {},
        "vllm.model_executor.layers.quantization.fp8": {"Fp8Config": StandInFp8Config},
    }
    out = {}
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so submodules resolve
        module.__dict__.update(attrs)
        out[name] = module
    return out


@contextlib.contextmanager
def installed_vllm_stand_in() -> Iterator[ProcessAfterLoadingRecorder]:
    """vLLM stand-ins in `sys.modules`; on exit, every module imported meanwhile is removed."""
    if "vllm" in sys.modules or vllm_installed():
        raise RuntimeError("vLLM is installed here: run these tests against it, not stand-ins")
    import triton.language  # noqa: F401  (real Triton, imported before the snapshot: it stays)

    before = set(sys.modules)
    recorder = ProcessAfterLoadingRecorder()
    sys.modules.update(_modules(recorder))
    try:
        yield recorder
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
