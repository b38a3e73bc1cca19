"""NeMo RL's refit into vLLM's CPU build: the linear parameters vLLM replaces on CPU, given back
before the refit loads, and vLLM's CPU FP8 packing, run again after it.

Two steps of vLLM's CPU backend (vLLM 0.25.1, measured) stand between NeMo RL's refit receiver
and the model it loads into:

1. Once weights are loaded, vLLM packs each unquantized linear layer's weight for its CPU GEMM
   and replaces the parameter by an empty one (`UnquantizedLinearMethod.
   process_weights_after_loading` -> `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`);
   the layer computes from the packed copy its `cpu_linear` holds. Its FP8 kernel
   (`CPUFp8BlockScaledMMKernel.process_weights_after_loading`) likewise replaces the FP8
   weight by a VNNI-packed plain parameter and the block scales by a plain one. NeMo RL's refit
   loads into the parameters (`model.load_weights`, each parameter's `weight_loader`), so on
   the replaced ones it fails ("'Parameter' object has no attribute 'weight_loader'": the
   emptied parameter is a plain one).
2. NeMo RL's FP8 patch (`fp8.process_weights_after_loading`, in place of vLLM's
   `Fp8LinearMethod.process_weights_after_loading` so parameters keep their identity across
   refits) never calls the kernel's own step, which on a GPU only re-lays out for DeepGEMM
   (NeMo RL does that itself) but on the CPU kernel is the VNNI packing that kernel reads
   its weight as (`fp8_scaled_mm_cpu(..., is_vnni=True)`). Without it the served FP8 layers'
   outputs are unrelated to x @ dequant(W)^T (measured by tests/test_nemo_cpu_vllm_worker.py
   on the tiny Qwen3's FP8 layers: relative error 1.3-1.44 without the packing, under 0.01
   with it; its BF16 layer 0.0016 either way).

`restore_replaced` gives each replaced linear parameter back as vLLM built it, from the
metadata vLLM records for its own weight reloading when it builds the model
(`record_metadata_for_reloading`: class, shape, dtype and attributes, `weight_loader`
included, on the meta device), materialized by vLLM's `materialize_meta_tensor` (contents
undefined: the refit writes every element, as NeMo RL's manifest requires every key before it
finalizes). NeMo RL then loads and finalizes (`process_weights_after_loading` over the model, as
on a GPU: the unquantized layers are packed and emptied again), and `pack_fp8` runs the CPU FP8
kernel's own step on each layer it serves. A refit that stops before finalizing leaves the
unquantized layers computing from their previous packed weights and the FP8 layers from what
was loaded, as NeMo RL's receiver leaves a GPU model; the run stops there (NeMo RL raises on a
failed refit).
"""

from __future__ import annotations

from typing import Any

import torch


def replaced(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """Each (linear layer, parameter name, recorded meta tensor) whose parameter vLLM's CPU
    processing replaced: another class than the one it built (a plain `Parameter` for a
    `ModelWeightParameter`), or emptied."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    out = []
    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is None or not isinstance(layer, LinearBase):
            continue
        for name, meta in info.restore_metadata[0].items():
            current = layer._parameters.get(name)
            if current is None:
                continue
            emptied = current.numel() == 0 and meta.numel() > 0
            if emptied or type(current) is not type(meta):
                out.append((layer, name, meta))
    return out


def restore_replaced(model: torch.nn.Module) -> int:
    """Register a parameter as vLLM built it in place of each `replaced` one; how many."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    found = replaced(model)
    for layer, name, meta in found:
        with LAYERWISE_INFO[layer].restore_device:
            param: Any = restore_layer_refs(materialize_meta_tensor(meta), layer)
        layer.register_parameter(name, param)
    return len(found)


def pack_fp8(model: torch.nn.Module) -> int:
    """vLLM's CPU FP8 kernel's own processing (VNNI packing) on each layer it serves and whose
    weight NeMo RL's FP8 patch left unpacked (still the class vLLM built); how many."""
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFp8BlockScaledMMKernel
    from vllm.model_executor.parameter import BasevLLMParameter

    count = 0
    for layer in model.modules():
        kernel = getattr(getattr(layer, "quant_method", None), "fp8_linear", None)
        weight = getattr(layer, "weight", None)
        if isinstance(kernel, CPUFp8BlockScaledMMKernel) and isinstance(weight, BasevLLMParameter):
            kernel.process_weights_after_loading(layer)
            count += 1
    return count
