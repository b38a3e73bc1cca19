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
