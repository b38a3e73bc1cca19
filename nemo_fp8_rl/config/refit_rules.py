"""Load-time rules for `refit.quantize_on: trainer` (FP8 weights quantized before the transfer).

With `generator` (the default) NeMo RL's own refit runs unchanged: the Megatron worker sends
BF16 weights and the vLLM worker quantizes each FP8 weight on arrival
(`nemo_rl/models/generation/vllm/quantization/fp8.py` `load_weights`). With `trainer` the
project's Megatron worker sends each FP8 weight as its (E4M3, FP32 `_scale_inv`) pair and the
project's vLLM worker extension loads the pairs as they are. That path exists only where both
project workers stand in for NeMo RL's, for 128x128 block FP8 and, with `vllm_cfg.is_mx`, for
MXFP8 (E4M3 with uint8 E8M0 `_scale_from_checkpoint` bytes, as 7ea279a's `quantize_mxfp8_weight`
makes them; a NeMo RL that does not read `is_mx`, v0.7.0, is refused when the run starts); every
other setting is refused here with the NeMo RL code that makes it different (file:line in the
vendored snapshots v0.7.0 and 7ea279a).
A CPU recipe loads with it (NeMo RL's loop on CPU runs it, `--engine nemo`); the embedded
engine, which refits through `refit.bridge`, refuses it itself
(`engines.local.recipe_checks.check_cpu_support`).
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.schema import source_of

KEY = "refit.quantize_on"
GEN = "policy.generation"
VLLM = "policy.generation.vllm_cfg"
MCORE = "policy.megatron_cfg"
FIX_OFF = f"or set {KEY}: generator (NeMo RL's refit)"


def _get(config: dict, key: str, default: Any = None) -> Any:
    value = lookup(config, key)
    return default if is_missing(value) else value


def _refusals(config: dict) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for every setting the trainer-side quantization path cannot serve."""
    out: list[tuple[str, str, str]] = []
    if _get(config, f"{GEN}.backend") != "vllm":
        out.append(
            (
                f"{GEN}.backend",
                "FP8 weights quantized on the trainer are loaded by the project's vLLM worker "
                "extension only",
                f"set {GEN}.backend: vllm",
            )
        )
    if _get(config, f"{VLLM}.precision") != "fp8":
        out.append(
            (
                f"{VLLM}.precision",
                f"BF16 rollout ({VLLM}.precision: {_get(config, f'{VLLM}.precision')}): vLLM "
                "holds no FP8 weight, so there is nothing to quantize",
                f"set {VLLM}.precision: fp8",
            )
        )
    if not _get(config, f"{MCORE}.enabled") or _get(config, "policy.dtensor_cfg.enabled"):
        out.append(
            (
                f"{MCORE}.enabled",
                "the FP8 pairs are produced by the project's Megatron policy worker; the DTensor "
                "worker sends BF16",
                f"set {MCORE}.enabled: true and policy.dtensor_cfg.enabled: false",
            )
        )
    if _get(config, f"{MCORE}.fp8_cfg.fp8_param"):
        out.append(
            (
                f"{MCORE}.fp8_cfg.fp8_param",
                "with FP8 parameters NeMo RL's export already emits FP8 + scale_inv pairs "
                "(7ea279a megatron_policy_worker.py:2256 _is_fp8_export); the trainer-side "
                "quantizer starts from BF16 masters",
                f"set {MCORE}.fp8_cfg.fp8_param: false",
            )
        )
    if (_get(config, f"{MCORE}.mtp_num_layers") or 0) > 0:
        out.append(
            (
                f"{MCORE}.mtp_num_layers",
                "a co-trained MTP drafter loads the policy stream itself (7ea279a "
                "vllm_backend.py:467 _maybe_refit_mtp_drafter) and would receive FP8 pairs",
                f"set {MCORE}.mtp_num_layers: 0",
            )
        )
    transport = _get(config, f"{GEN}.refit_transport")
    if transport is not None:
        out.append(
            (
                f"{GEN}.refit_transport",
                f"refit_transport {transport!r} bypasses the IPC-ZMQ and collective paths the "
                "FP8 pairs travel (7ea279a weight_sync/factory.py:130, vllm/config.py:29)",
                f"set {GEN}.refit_transport: null",
            )
        )
    return out


def quantize_on_trainer(config: dict, prov: dict[str, str]) -> list[Problem]:
    """`refit.quantize_on: trainer` needs FP8 rollout (block or MXFP8) on NeMo RL's Megatron +
    vLLM path."""
    if _get(config, KEY, "generator") != "trainer":
        return []
    return [
        Problem(key, f"{KEY}: trainer: {problem}", f"{fix}, {FIX_OFF}", source_of(prov, key))
        for key, problem, fix in _refusals(config)
    ]
