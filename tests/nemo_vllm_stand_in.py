"""Named CPU stand-ins for the vLLM pieces NeMo RL's vLLM-side refit code imports.

vLLM is a CUDA build and is not installed in the contract environment. The vLLM names NeMo
RL's `quantization/fp8.py` and `vllm_backend.py` import live in the package
(`nemo_fp8_rl.engines.nemo.cpu.vllm_names`, which the CPU generation worker installs in its
process); `installed_vllm_stand_in()` puts them into `sys.modules`, imports NeMo RL's modules
against them, and removes everything it added afterwards (NeMo RL's modules too), so other
tests see the machine as it is. Nothing NeMo RL computes is replaced: its `load_weights`,
`_is_fp8_weight`, `cast_tensor_to_fp8_blockwise`, `update_weights_*` and packing code run as
shipped.

`RecordingModel` is the vLLM model: a module tree shaped like vLLM's Qwen3 or Qwen3-MoE (fused
`qkv_proj` and `gate_up_proj` through `packed_modules_mapping`, router and fused experts, FP8 or
BF16 per layer) whose `load_weights` records each call's (name, tensor) list.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from nemo_fp8_rl.engines.nemo.cpu import vllm_names
from nemo_fp8_rl.engines.nemo.cpu.vllm_names import (
    Fp8Config as StandInFp8Config,
)
from nemo_fp8_rl.engines.nemo.cpu.vllm_names import (
    ProcessAfterLoading as ProcessAfterLoadingRecorder,
)
from nemo_fp8_rl.engines.nemo.cpu.vllm_names import installed as installed_vllm_stand_in
from nemo_fp8_rl.engines.nemo.cpu.vllm_names import vllm_installed

__all__ = [
    "ProcessAfterLoadingRecorder",
    "RecordingModel",
    "StandInFp8Config",
    "StandInModelRunner",
    "installed_vllm_stand_in",
    "vllm_installed",
]

FP8 = torch.float8_e4m3fn


class StandInLinearBase(vllm_names.LinearBase):
    """vLLM's `LinearBase`: NeMo RL tests `isinstance` and `weight.dtype` (FP8 when quantized)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, 1, dtype=dtype), requires_grad=False)


class StandInRoutedExperts(vllm_names.RoutedExperts):
    """vLLM's `FusedMoE` (v0.7.0's vLLM) / `RoutedExperts` (7ea279a's): holds w13/w2 weights."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.empty(1, 1, 1, dtype=dtype), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.empty(1, 1, 1, dtype=dtype), requires_grad=False)


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
