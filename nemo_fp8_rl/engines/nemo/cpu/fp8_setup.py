"""Which layers the CPU generation worker serves in FP8, decided by NeMo RL's own `init_fp8`.

With `vllm_cfg.precision: fp8`, NeMo RL's vLLM worker calls `init_fp8(vllm_cfg, model_name,
model_parallel_size)`: it sets the FP8 module's `global_fp8_config` (pow2 weight and
activation scales, the first/last BF16 layers, the KV-cache dtype), applies its patches to
vLLM's FP8 methods (here: the `vllm_names` classes) and returns vLLM's quantization config,
whose `ignored_layers` are the linear layers vLLM builds in BF16 (with `is_mx` the config is
ModelOpt's MXFP8 one and the patches those of vLLM's MXFP8 methods)
(`num_first_layers_in_bf16`, `num_last_layers_in_bf16`, `quantization_ignored_layer_kws`).
This module calls it as shipped and serves every other decoder linear layer in FP8.

NeMo RL keeps that state in module globals (`global_fp8_config`, `fp8_state` with its cache of
FP8 parameter names). A Ray worker process holds one worker; `globals()` reinstates this
worker's state around each load anyway, so several workers built in one process (tests) each
load with their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn


def _reset(fp8: Any) -> None:
    """Undo a previous `init_fp8` in this process (its patches assert they run once)."""
    for patcher in list(fp8.fp8_state.vllm_patches):
        with contextlib.suppress(RuntimeError):
            patcher.stop()
    fp8.fp8_patches_applied = False
    fp8.fp8_state = fp8.FP8State()


def _flat(names: list[Any]) -> set[str]:
    """`ignored_layers` as a set of module names. v0.7.0's `init_fp8` appends one list per
    `num_*_layers_in_bf16` setting (a nested list); 7ea279a's extends one flat list."""
    out: set[str] = set()
    for item in names:
        out |= _flat(item) if isinstance(item, list) else {str(item)}
    return out


def _decoder_linear_names(hf_model: nn.Module) -> set[str]:
    return {
        fqn
        for fqn, mod in hf_model.named_modules()
        if isinstance(mod, nn.Linear) and ".layers." in f".{fqn}"
    }


@dataclass
class Fp8Setup:
    """FP8 settings of one CPU generation worker (module docstring)."""

    fp8_weights: bool = False
    mx: bool = False  # vllm_cfg.is_mx: MXFP8 weights (1x32 E8M0 bytes) and activations
    fp8_modules: set[str] = field(default_factory=set)
    act_pow2: bool = False
    kv_fp8: bool = False
    cache_dtype: str = "auto"
    config: Any = None  # NeMo RL's FP8Config
    state: Any = None  # NeMo RL's FP8State

    @classmethod
    def from_config(
        cls, vllm_cfg: dict[str, Any], model_name: str, hf_model: nn.Module
    ) -> Fp8Setup:
        """BF16 unless `precision: fp8`; then NeMo RL's `init_fp8` decides (module doc)."""
        if vllm_cfg.get("precision") != "fp8":
            return cls()
        from nemo_rl.models.generation.vllm.quantization import fp8

        _reset(fp8)
        kwargs = fp8.init_fp8(vllm_cfg, model_name, 1)
        if vllm_cfg.get("async_engine") and not fp8.fp8_patches_applied:
            # the async engine: NeMo RL applies its patches in the engine process it spawns
            # (`my_run_engine_core`); the stand-in serves in this process, so here
            fp8.apply_fp8_patches(None, fp8.global_fp8_config)
        ignored = _flat(kwargs["hf_overrides"]["quantization_config"].get("ignored_layers", []))
        config = fp8.global_fp8_config
        cache_dtype = str(kwargs["kv_cache_dtype"])
        return cls(
            fp8_weights=True,
            mx=bool(getattr(config, "is_mx", False)),
            fp8_modules=_decoder_linear_names(hf_model) - ignored,
            act_pow2=bool(config.use_activation_pow2_scale),
            kv_fp8=cache_dtype.startswith("fp8"),
            cache_dtype=cache_dtype,
            config=config,
            state=fp8.fp8_state,
        )

    @contextlib.contextmanager
    def globals(self) -> Iterator[None]:
        """NeMo RL's FP8 module globals set to this worker's inside the block."""
        if self.config is None:
            yield
            return
        from nemo_rl.models.generation.vllm.quantization import fp8

        fp8.global_fp8_config, fp8.fp8_state = self.config, self.state
        yield
