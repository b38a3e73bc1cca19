"""The engines' own configuration checks, after NeMo RL's driver code ran: vLLM's and Megatron's.

- vLLM: on the keyword arguments NeMo RL's vLLM worker passed to `vllm.LLM(...)`, vLLM's own
  `EngineArgs` validation where vLLM is installed, else the reproduced checks of `vllm_checks`
  (cited for the vLLM version the NeMo RL tree pins);
- Megatron: megatron-core's `TransformerConfig` for the model and `policy.megatron_cfg`, and NeMo
  RL's own sequence-packing assertion (`megatron_checks`).

Each finding is a `LocatedError` (key path, upstream file:line, fix); all are reported at once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight import megatron_checks, vllm_checks
from nemo_fp8_rl.engines.nemo.preflight.located import LocatedError
from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config


def vllm_findings(
    llm_kwargs: dict[str, Any], vllm_cfg: dict[str, Any], tree: Path
) -> list[LocatedError]:
    """vLLM's checks on `LLM(**llm_kwargs)`: its own `EngineArgs` validation where installed (plus
    the reproduced layer checks it does not reach: they run while vLLM builds the model), else
    all reproduced."""
    hf = model_config(llm_kwargs["model"])
    env = vllm_cfg.get("env_vars") or {}
    version = vllm_checks.pinned_vllm(tree)
    if importlib.util.find_spec("vllm") is None:
        return vllm_checks.engine_checks(llm_kwargs, hf, version, env)
    found = vllm_checks.engine_args_check(llm_kwargs)
    layers = vllm_checks.engine_checks(llm_kwargs, hf, version, env, vllm_checks.LAYER_CHECKS)
    return ([found] if found else []) + layers


def megatron_findings(policy: dict[str, Any], tree: Path) -> list[LocatedError]:
    """megatron-core's TransformerConfig and NeMo RL's packing check for a Megatron policy."""
    if not policy.get("megatron_cfg", {}).get("enabled"):
        return []
    hf = model_config(policy["model_name"])
    found = [
        megatron_checks.transformer_config_check(policy, hf, megatron_checks.pinned_te(tree)),
        megatron_checks.packing_check(policy),
    ]
    return [f for f in found if f is not None]
