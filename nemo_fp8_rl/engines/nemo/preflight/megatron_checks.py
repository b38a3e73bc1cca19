"""The Megatron worker's configuration checks, on CPU: megatron-core's `TransformerConfig` and
NeMo RL's sequence-packing factors.

`transformer_config_check` builds megatron-core's real `TransformerConfig` (its `__post_init__`
holds the parallelism, MoE and FP8 validation) from the model's `config.json` and the policy's
`megatron_cfg`, with the values NeMo RL's `nemo_rl/models/megatron/setup.py` copies onto the model
provider by the same name (`SAME_NAME`, the FP8 settings of `fp8_cfg`, the dtypes). Transformer
Engine (a CUDA library) is absent here, so megatron-core's version query is answered with the TE
version NeMo RL's pyproject.toml pins (`pinned_te`): `TEVersionAnswer`.

`packing_check` calls NeMo RL's own `_get_pack_sequence_parameters_for_megatron`
(`nemo_rl/models/megatron/data.py`, the assertion that `make_sequence_length_divisible_by` is a
multiple of TP (with sequence parallelism) and 2·CP), with `megatron.bridge` stood in.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight.located import LocatedError, innermost_in, locate
from nemo_fp8_rl.engines.nemo.preflight.pins import pinned_versions
from nemo_fp8_rl.engines.nemo.preflight.recorders import Recorder, StandIn, installed

STOOD_IN = (
    StandIn(
        "megatron.bridge",
        "stand_in_modules.megatron_bridge_stand_in",
        "its import needs Transformer Engine (CUDA); NeMo RL's megatron/data.py imports one packing helper from it",
    ),
    StandIn(
        "megatron.core is_te_min_version / get_te_version; TE kernels (`TE_KERNELS`)",
        "TEVersionAnswer",
        "Transformer Engine is absent; answered with the version NeMo RL's pyproject.toml pins (its fused RoPE and MoE permutation kernels as present)",
    ),
)
# Transformer Engine kernels megatron-core's TransformerConfig tests for presence (None without TE).
TE_KERNELS = {
    "megatron.core.models.common.embeddings.rope_utils": (
        "fused_apply_rotary_pos_emb",
        "fused_apply_rotary_pos_emb_thd",
    ),
    "megatron.core.transformer.moe.moe_utils": (
        "fused_permute",
        "fused_permute_with_probs",
        "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs",
        "fused_unpermute",
    ),
}
MEGATRON = "policy.megatron_cfg"
# megatron_cfg keys NeMo RL's setup.py assigns to the model config under the same name.
SAME_NAME = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "sequence_parallel",
    "context_parallel_size",
    "expert_tensor_parallel_size",
    "expert_model_parallel_size",
    "moe_router_load_balancing_type",
    "moe_token_dispatcher_type",
    "moe_permute_fusion",
    "apply_rope_fusion",
    "bias_activation_fusion",
)


def pinned_te(nemo_rl_tree: Path) -> str | None:
    """The highest Transformer Engine version NeMo RL's pyproject.toml names (its override pin)."""
    found = pinned_versions(
        nemo_rl_tree,
        r"TransformerEngine\.git@(?:release_)?v(\d+(?:\.\d+)+)",
        r"transformer-engine[^\"=]*==(\d+(?:\.\d+)+)",
    )
    return max(found, key=lambda v: tuple(int(p) for p in v.split("."))) if found else None


class TEVersionAnswer(Recorder):
    """megatron-core's `is_te_min_version(v)`: answered from the pinned TE version."""

    def __init__(self, version: str) -> None:
        super().__init__(version)
        from packaging.version import Version

        self.version = Version(version)

    def get_te_version(self) -> Any:
        return self.version

    def te_kernel(self, name: str) -> Any:
        """A TE kernel megatron-core tests for presence only (fused RoPE)."""

        def kernel(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"{name}: Transformer Engine kernel stand-in, not callable on CPU")

        return kernel

    def __call__(self, wanted: str, check_equality: bool = True) -> bool:
        from packaging.version import Version

        self._record("is_te_min_version", wanted)
        return self.version >= Version(wanted) if check_equality else self.version > Version(wanted)


def transformer_kwargs(policy: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """`TransformerConfig` keyword arguments for the policy's model and `megatron_cfg`."""
    import torch
    import torch.nn.functional as F

    mcfg = policy["megatron_cfg"]
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    heads = hf["num_attention_heads"]
    kw: dict[str, Any] = {
        "num_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "num_attention_heads": heads,
        "num_query_groups": hf.get("num_key_value_heads") or heads,
        "kv_channels": hf.get("head_dim") or hf["hidden_size"] // heads,
        "ffn_hidden_size": hf["intermediate_size"],
        "gated_linear_unit": hf.get("hidden_act", "silu") == "silu",
        "activation_func": F.silu if hf.get("hidden_act", "silu") == "silu" else F.gelu,
        "add_bias_linear": False,
        "add_qkv_bias": bool(hf.get("attention_bias", hf.get("model_type") == "qwen2")),
        "normalization": "RMSNorm",
        "bf16": policy.get("precision") == "bfloat16",
        "params_dtype": dtypes.get(policy.get("precision"), torch.float32),
        "pipeline_dtype": dtypes.get(mcfg.get("pipeline_dtype")),
    }
    experts = hf.get("num_experts") or hf.get("n_routed_experts")
    if experts:
        kw |= {
            "num_moe_experts": experts,
            "moe_ffn_hidden_size": hf.get("moe_intermediate_size"),
            "moe_router_topk": hf.get("num_experts_per_tok", 2),
            "moe_grouped_gemm": bool(mcfg.get("moe_grouped_gemm", False)),
        }
    kw |= {k: mcfg[k] for k in SAME_NAME if mcfg.get(k) is not None}
    if not experts:  # MoE-only settings NeMo RL also sets on dense models; mcore ignores them
        for k in ("moe_token_dispatcher_type", "moe_router_load_balancing_type"):
            kw.pop(k, None)
    fp8 = mcfg.get("fp8_cfg") or {}
    if fp8.get("enabled"):
        kw |= {"fp8": fp8["fp8"], "fp8_recipe": fp8["fp8_recipe"], "fp8_param": fp8["fp8_param"]}
    return kw


def _key_for(message: str) -> str:
    """The megatron_cfg key a TransformerConfig message names first (else the section)."""
    names = re.findall(r"[a-z][a-z0-9_]+", message)
    for name in names:
        if name in SAME_NAME:
            return f"{MEGATRON}.{name}"
        if name in ("fp8", "fp8_recipe", "fp8_param"):
            return f"{MEGATRON}.fp8_cfg.{name}"
    return MEGATRON


def transformer_config_check(
    policy: dict[str, Any], hf: dict[str, Any], te_version: str | None
) -> LocatedError | None:
    """megatron-core's `TransformerConfig(...)` validation; None when it accepts the settings."""
    import megatron.core.transformer.transformer_config as tc
    import megatron.core.utils as mu

    answer = TEVersionAnswer(te_version or "0")
    swaps = [(m, "is_te_min_version", answer) for m in (tc, mu) if hasattr(m, "is_te_min_version")]
    swaps += [
        (m, "get_te_version", answer.get_te_version)
        for m in (tc, mu)
        if hasattr(m, "get_te_version")
    ]
    for module_name, names in TE_KERNELS.items():
        module = importlib.import_module(module_name)
        swaps += [(module, n, answer.te_kernel(n)) for n in names if getattr(module, n, 0) is None]
    try:
        with installed(swaps):
            tc.TransformerConfig(**transformer_kwargs(policy, hf))
    except (ValueError, AssertionError, TypeError, NotImplementedError) as exc:
        file, line = innermost_in(exc, "megatron/core")
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return LocatedError(
            _key_for(text),
            file,
            line,
            f"megatron-core TransformerConfig: {type(exc).__name__}: {text}"[:400],
            "change the recipe's policy.megatron_cfg (parallelism / FP8) so that this holds",
        )
    return None


def packing_check(policy: dict[str, Any]) -> LocatedError | None:
    """NeMo RL's own packing-factor assertion for the policy (when sequence packing is on)."""
    from nemo_fp8_rl.engines.nemo.preflight.stand_in_modules import megatron_bridge_stand_in

    if not policy.get("sequence_packing", {}).get("enabled"):
        return None
    key = "policy.make_sequence_length_divisible_by"
    with megatron_bridge_stand_in():
        from nemo_rl.models.megatron import data

        try:
            data._get_pack_sequence_parameters_for_megatron(
                policy["megatron_cfg"],
                policy["make_sequence_length_divisible_by"],
                policy["max_total_sequence_length"],
            )
        except AssertionError as exc:
            err = locate(exc, {})
            assert err is not None  # raised inside NeMo RL's data.py
            mcfg = policy["megatron_cfg"]
            factor = (
                mcfg["context_parallel_size"] * 2 if mcfg["context_parallel_size"] > 1 else 1
            ) * (mcfg["tensor_model_parallel_size"] if mcfg["sequence_parallel"] else 1)
            return LocatedError(
                key,
                err.file,
                err.line,
                err.message,
                f"set {key} to a multiple of {factor} (TP with sequence parallelism x 2·CP)",
            )
    return None
