"""vLLM's engine checks on the arguments NeMo RL's worker passes to `vllm.LLM(...)`, without vLLM.

Where vLLM is installed, `engine_args_check` runs vLLM's own `EngineArgs` validation. Where it is
not (a login node, CI), `engine_checks` applies the conditions below, which vLLM applies when it
builds the engine; each finding cites the vLLM file and line (for the vLLM version the NeMo RL
tree pins in its pyproject.toml; `CITED` holds the lines, read from vLLM 0.20.0 and 0.25.1):

| check | vLLM condition (facts from its source) |
|---|---|
| `max_len` | `max_model_len` <= the smallest of the config's position keys (`max_position_embeddings`, `n_positions`, ...), times the RoPE factor unless the rope type is `su`/`longrope`/`llama3` (`yarn`: `original_max_position_embeddings` x factor); `model_max_length` overrides; `VLLM_ALLOW_LONG_MAX_MODEL_LEN` turns the error off |
| `heads` | total attention heads % TP == 0 |
| `kv_heads` | TP >= KV heads: TP % KV heads == 0; else KV heads % TP == 0 |
| `gpu_mem` | 0 < `gpu_memory_utilization` <= 1 (a pydantic field bound) |
| `fp8_row` | block FP8, TP > 1: a row-parallel layer's input per partition % block_k == 0 (`o_proj`: heads x head_dim / TP, heads x v_head_dim with MLA; dense `down_proj`: intermediate / TP). Merged column-parallel layers (`qkv_proj`, `gate_up_proj`) skip the check when a partition is unaligned (`_maybe_allow_fp8_block_shape_mismatch`) |
| `fp8_moe_n`, `fp8_moe_k` | block FP8 MoE: the experts' intermediate size per partition (moe_intermediate / TP, unsplit with expert parallelism) % block_n == 0, and % block_k == 0 when TP > 1 |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.engines.nemo.preflight.located import LocatedError, innermost_in
from nemo_fp8_rl.engines.nemo.preflight.pins import pinned_versions

VLLM_CFG = "policy.generation.vllm_cfg"
# LLM(...) arguments NeMo RL's vLLM worker takes from vllm_cfg under the same name
FROM_VLLM_CFG = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "enforce_eager",
    "load_format",
)

# check -> (vLLM file, {vLLM version: line of the raise/assert/bound})
CITED: dict[str, tuple[str, dict[str, int]]] = {
    "max_len": ("vllm/config/model.py", {"0.20.0": 2180, "0.25.1": 2276}),
    "heads": ("vllm/config/model.py", {"0.20.0": 1126, "0.25.1": 1213}),
    "kv_heads": ("vllm/model_executor/layers/linear.py", {"0.20.0": 1033, "0.25.1": 998}),
    "gpu_mem": ("vllm/config/cache.py", {"0.20.0": 66, "0.25.1": 68}),
    "fp8_row": (
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
        {"0.20.0": 1126, "0.25.1": 1223},
    ),
    "fp8_moe_n": ("vllm/model_executor/layers/quantization/fp8.py", {"0.20.0": 629, "0.25.1": 563}),
    "fp8_moe_k": ("vllm/model_executor/layers/quantization/fp8.py", {"0.20.0": 636, "0.25.1": 570}),
}
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def pinned_vllm(nemo_rl_tree: Path) -> str | None:
    """The vLLM version NeMo RL's pyproject.toml pins (`vllm==X`), or None."""
    found = pinned_versions(nemo_rl_tree, r"\bvllm==([0-9][0-9a-z.]*)")
    return found[0] if found else None


def cite(check: str, version: str | None) -> tuple[str, int]:
    """(file, line) of `check` in vLLM `version`; line 0 when that version was not read."""
    file, lines = CITED[check]
    return file, lines.get(version or "", 0)


@dataclass
class _Finding:
    check: str
    key: str
    message: str
    fix: str


def derived_max_len(hf: dict[str, Any]) -> tuple[float, str | None]:
    """The model's own maximum length as vLLM derives it: (length, config key)."""
    length, key = math.inf, None
    for name in POSITION_KEYS:
        value = hf.get(name)
        if value is not None and value < length:
            length, key = value, name
    if hf.get("model_max_length"):
        length, key = hf["model_max_length"], "model_max_length"
    rope = hf.get("rope_parameters") or hf.get("rope_scaling")
    if rope and math.isfinite(length):
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type not in ("su", "longrope", "llama3"):
            if rope_type == "yarn":
                length = rope["original_max_position_embeddings"]
            length *= rope.get("factor") or 1.0
    return length, key


def _position_findings(kw: dict[str, Any], hf: dict[str, Any], env: dict) -> list[_Finding]:
    out = []
    limit, key = derived_max_len(hf)
    asked = kw.get("max_model_len")
    if asked is not None and asked != -1 and asked > limit:
        allowed = str(env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")).strip().lower()
        if allowed not in ("1", "true"):
            out.append(
                _Finding(
                    "max_len",
                    f"{VLLM_CFG}.max_model_len",
                    f"ValueError: max_model_len {asked} is greater than the model's "
                    f"{key}={int(limit)} (config.json)",
                    f"set max_model_len (and policy.max_total_sequence_length it follows) to at "
                    f"most {int(limit)}",
                )
            )
    util = kw.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        out.append(
            _Finding(
                "gpu_mem",
                f"{VLLM_CFG}.gpu_memory_utilization",
                f"ValidationError: gpu_memory_utilization {util} is outside (0, 1]",
                "set it in (0, 1]",
            )
        )
    return out


def _head_findings(tp: int, hf: dict[str, Any]) -> list[_Finding]:
    heads = hf.get("num_attention_heads")
    kv = hf.get("num_key_value_heads") or heads
    key = f"{VLLM_CFG}.tensor_parallel_size"
    out = []
    if heads and heads % tp:
        out.append(
            _Finding(
                "heads",
                key,
                f"ValueError: {heads} attention heads are not divisible by TP {tp}",
                f"use a TP that divides {heads}",
            )
        )
    if kv and (tp % kv if tp >= kv else kv % tp):
        out.append(
            _Finding(
                "kv_heads",
                key,
                f"AssertionError: {kv} KV heads and TP {tp}: neither divides the other",
                f"use a TP that divides {kv} or a multiple of it",
            )
        )
    return out


def _block(kw: dict[str, Any]) -> tuple[int, int] | None:
    """(block_n, block_k) of a block-FP8 LLM(...) call, else None."""
    qcfg = (kw.get("hf_overrides") or {}).get("quantization_config") or {}
    size = qcfg.get("weight_block_size")
    if kw.get("quantization") != "fp8" or not size:
        return None
    return int(size[0]), int(size[1])


def _fp8_findings(kw: dict[str, Any], tp: int, hf: dict[str, Any]) -> list[_Finding]:
    block = _block(kw)
    if block is None:
        return []
    block_n, block_k = block
    key, out = f"{VLLM_CFG}.tensor_parallel_size", []
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if hf.get("kv_lora_rank"):  # MLA (DeepSeek-V3): o_proj reads heads x v_head_dim
        head_dim = hf["v_head_dim"]
    rows = {"o_proj": hf["num_attention_heads"] * head_dim}
    experts = hf.get("num_experts") or hf.get("n_routed_experts") or 0
    if not experts or hf.get("mlp_only_layers") or hf.get("first_k_dense_replace"):
        rows["down_proj"] = hf["intermediate_size"]  # the dense layers' MLP
    for layer, size in rows.items():
        if tp > 1 and size % tp == 0 and (size // tp) % block_k:
            out.append(
                _Finding(
                    "fp8_row",
                    key,
                    f"ValueError: FP8 block shape: {layer} input {size} / TP {tp} = {size // tp} "
                    f"per partition, not a multiple of block_k {block_k}",
                    _tp_fix(size, block_k, "the FP8 blocks"),
                )
            )
    if experts:
        inter = hf.get("moe_intermediate_size") or hf["intermediate_size"]
        moe_tp = 1 if kw.get("enable_expert_parallel") else tp
        part = inter // moe_tp
        for check, block_size, needed in (
            ("fp8_moe_n", block_n, True),
            ("fp8_moe_k", block_k, tp > 1),
        ):
            if needed and part % block_size:
                out.append(
                    _Finding(
                        check,
                        key,
                        f"ValueError: FP8 MoE block shape: expert gate/up {inter} / TP {moe_tp} = "
                        f"{part} per partition, not a multiple of {block_size}",
                        _tp_fix(inter, block_size, "the FP8 MoE blocks"),
                    )
                )
                break
    return out


def _tp_fix(size: int, block: int, what: str) -> str:
    ok = [t for t in (1, 2, 4, 8) if size % t == 0 and (size // t) % block == 0]
    return f"use a vLLM TP in {ok} for {what} ({size} / TP must be a multiple of {block})"


LAYER_CHECKS = ("kv_heads", "fp8_row", "fp8_moe_n", "fp8_moe_k")  # run when vLLM builds layers


def engine_checks(
    llm_kwargs: dict[str, Any],
    hf_config: dict[str, Any],
    vllm_version: str | None,
    env: dict,
    only: tuple[str, ...] | None = None,
) -> list[LocatedError]:
    """vLLM's engine checks on `LLM(**llm_kwargs)` for a model with `hf_config` (config.json).

    `only`: the checks to apply (default all); `LAYER_CHECKS` are those vLLM makes while it builds
    the model's layers, which its `EngineArgs` validation does not reach.
    """
    tp = int(llm_kwargs.get("tensor_parallel_size") or 1)
    findings = (
        _position_findings(llm_kwargs, hf_config, env)
        + _head_findings(tp, hf_config)
        + _fp8_findings(llm_kwargs, tp, hf_config)
    )
    out = []
    for f in [f for f in findings if only is None or f.check in only]:
        file, line = cite(f.check, vllm_version)
        where = f" {vllm_version}" if vllm_version else ""
        out.append(LocatedError(f.key, file, line, f"vLLM{where}: {f.message}", f.fix))
    return out


def for_this_build(llm_kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`llm_kwargs` as vLLM's build here can judge them for the workers' GPUs, and the arguments
    set otherwise. NeMo RL's worker passes `enable_sleep_mode=True`; vLLM refuses it on a
    platform without sleep mode ("Sleep mode is not supported on current platform",
    vllm/config/model.py, `current_platform.is_sleep_mode_available()`: CUDA, ROCm and XPU
    only), so on vLLM's CPU build it is checked off, as the CPU loop runs NeMo RL's worker there
    (`cpu.vllm_worker`); the workers' GPUs have sleep mode."""
    from vllm.platforms import current_platform

    if llm_kwargs.get("enable_sleep_mode") and not current_platform.is_sleep_mode_available():
        return {**llm_kwargs, "enable_sleep_mode": False}, ["enable_sleep_mode"]
    return llm_kwargs, []


def engine_args_check(llm_kwargs: dict[str, Any]) -> LocatedError | None:
    """vLLM's own `EngineArgs(...).create_engine_config()` on the recorded kwargs (vLLM installed),
    with what this build cannot judge for a GPU set as the CPU loop sets it (`for_this_build`).

    The engine is not started; a failure is located at vLLM's innermost frame.
    """
    import vllm

    llm_kwargs, _ = for_this_build(llm_kwargs)
    fields = set(vllm.EngineArgs.__dataclass_fields__)
    try:
        vllm.EngineArgs(
            **{k: v for k, v in llm_kwargs.items() if k in fields}
        ).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - every vLLM refusal becomes a report
        where = innermost_in(exc, "vllm")
        text = " ".join(str(exc).split())  # pydantic's errors span several lines
        named = [k for k in FROM_VLLM_CFG if k in llm_kwargs and k in text]
        return LocatedError(
            f"{VLLM_CFG}.{named[0]}" if named else None,
            where[0],
            where[1],
            f"vLLM {vllm.__version__}: {type(exc).__name__}: {text}"[:400],
            "change the recipe's policy.generation.vllm_cfg / vllm_kwargs so vLLM accepts it",
        )
    return None
