"""Weight-refit bridge: trainer weights (Megatron-Core or HF names) → the generation engine.

    from nemo_fp8_rl.refit import RefitPlan, stream_refit, ModuleReceiver, RefitError
    plan = RefitPlan.from_config(config, param_names)       # NeMo RL keys decide FP8 vs BF16
    for bucket in stream_refit(named_tensors, plan):         # (hf_name, tensor) in, buckets out
        ...                                                  # picklable: ship with Ray
    ModuleReceiver(model).apply(buckets)                     # verify all, then apply (or raise)

Parts: `names` (Megatron/HF → engine names, GQA-correct splits), `plan` (per-name decisions),
`stream` (requantization with the `fp8` core, buckets, manifests), `verify` (receiver checks),
`module_receiver` (transformers models), `vllm_receiver` (vLLM `reload_weights`), `export`
(FP8 safetensors checkpoint + `quantization_config`).

NeMo RL path (`refit.quantize_on: trainer`): the trainer sends each FP8 weight as the pair NeMo
RL's vLLM worker would otherwise make on arrival, bit for bit:

    from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules
    rules = NemoFp8Rules.from_vllm_cfg(vllm_cfg, num_layers)  # precision fp8, pow2, BF16 layers
    layout = NemoFp8Layout(streamed_names, rules)             # which names vLLM holds in FP8
    layout.quantize_named(name, bf16)    # [(name, e4m3), (name + "_scale_inv", fp32)] or as-is
    layout.planned(name, shape, dtype)   # the same entries as (name, shape, dtype) metadata

`nemo_quant.quantize_blockwise_like_nemo_rl(w, pow2_scale=...)` is the quantizer (CPU fast path,
Triton on CUDA), `nemo_fp8.expand_grouped_experts` the grouped-MoE expansion, `hf_shapes` the
HF-named shapes of a model from its `config.json`, and `nemo_reference` loads NeMo RL's own
`fp8.py` from a source tree to verify against (tests, benchmark, sweep).
"""

from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.module_receiver import ModuleReceiver
from nemo_fp8_rl.refit.names import (
    AttentionLayout,
    MappingError,
    hf_to_engine,
    megatron_to_engine,
    megatron_to_hf,
)
from nemo_fp8_rl.refit.plan import RefitPlan, RefitPlanError
from nemo_fp8_rl.refit.stream import Bucket, ManifestEntry, stream_refit
from nemo_fp8_rl.refit.verify import Received, collect

__all__ = [
    "AttentionLayout",
    "Bucket",
    "ManifestEntry",
    "MappingError",
    "ModuleReceiver",
    "Received",
    "RefitError",
    "RefitPlan",
    "RefitPlanError",
    "collect",
    "hf_to_engine",
    "megatron_to_engine",
    "megatron_to_hf",
    "stream_refit",
]
