"""Load-time rule for `local.fp4` (4-bit W4A4 emulation on the embedded CPU engine).

NVFP4 and MXFP4 are emulated by the embedded engine only: NeMo RL reads no key for 4-bit
Megatron training (its NVFP4 path is ModelOpt quantization-aware training, `policy.quant_cfg`,
with rollouts through ModelOpt's vLLM checkpoint format). The 4-bit format replaces FP8 on both
sides, so a recipe that also turns FP8 on would measure neither.
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.config.schema import source_of

KEY = "local.fp4"
_FP8_KEYS = (
    ("policy.megatron_cfg.fp8_cfg.enabled", True, "false"),
    ("policy.generation.vllm_cfg.precision", "fp8", "bfloat16"),
    ("policy.generation.vllm_cfg.kv_cache_dtype", "fp8", "auto"),
)


def _get(config: dict, key: str) -> Any:
    value = lookup(config, key)
    return None if is_missing(value) else value


def four_bit_emulation(config: dict, prov: dict[str, str]) -> list[Problem]:
    """`local.fp4` runs on the embedded CPU engine only, and in place of FP8 (module doc)."""
    kind = _get(config, KEY)
    if not kind:
        return []
    where = source_of(prov, KEY)
    out = []
    if not on_cpu(config):
        out.append(
            Problem(
                KEY,
                f"{kind} emulation runs on the embedded CPU engine only (cluster.gpus_per_node: 0); "
                "NeMo RL has no 4-bit Megatron training key (its NVFP4 path is ModelOpt QAT)",
                f"remove {KEY} from a GPU recipe, or set cluster.gpus_per_node=0",
                where,
            )
        )
    for key, bad, good in _FP8_KEYS:
        if _get(config, key) == bad:
            out.append(
                Problem(
                    key,
                    f"{KEY}: {kind} replaces FP8 on both sides, but {key} is {bad}",
                    f"set {key}={good} (configs/precision/{kind}-cpu.yaml on a BF16 recipe does)",
                    source_of(prov, key),
                )
            )
    return out
