"""The embedded engine's rollout model, counted as the generation side serves it.

The rollout plays vLLM's part with `FP8EmulatedLinear` layers: a layer computes W8A8 while its
`fp8_enabled` is set (its weight quantized with the rollout's `weight_spec`), BF16 otherwise.
`served_counts` reports each decoder linear layer as `guards.served` names vLLM's (`fp8-block`
for [128, 128] weight blocks, `mxfp8` for 1x32 E8M0 blocks, the 4-bit kind of a `local.fp4`
recipe, `fp8-<granularity>` for another scaling, `bf16`), so `guards.served.check_served`
judges both engines alike at step 0 and after every refit.
"""

from __future__ import annotations

from torch import nn

from nemo_fp8_rl.fp8.emulation import FP8EmulatedLinear
from nemo_fp8_rl.guards.served import BF16, FP8_BLOCK, LAYER, MXFP8, ServedCounts


def _precision(module: nn.Module) -> str:
    if not isinstance(module, FP8EmulatedLinear) or not module.fp8_enabled:
        return BF16
    spec = module.weight_spec
    kind = getattr(spec, "kind", None)  # a 4-bit FP4Spec
    if kind is not None:
        return str(kind)
    if spec.granularity == "blockwise":
        return FP8_BLOCK
    return MXFP8 if spec.granularity == "mxfp8" else f"fp8-{spec.granularity}"


def served_counts(model: nn.Module) -> ServedCounts:
    """Every decoder linear layer of the rollout model and the precision it computes in."""
    layers = {
        name: _precision(module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and LAYER.search(f".{name}")
    }
    depth = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0) or 0)
    return ServedCounts(layers, None, "embedded rollout engine", depth)
