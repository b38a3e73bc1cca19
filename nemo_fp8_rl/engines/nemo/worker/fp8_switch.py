"""Turn Megatron-Core's FP8 compute off and on again in a policy worker (for BF16 shadow passes).

Megatron-Core enters Transformer Engine's FP8 autocast inside `TransformerBlock.forward` from
`config.fp8` (`megatron.core.fp8_utils.get_fp8_context` returns a null context when it is
falsy), so an outer `fp8_autocast(enabled=False)` would be overridden. The switch therefore sets
`fp8 = None` on every `TransformerConfig` reachable from the model chunks (modules usually share
one object) and puts the saved values back afterwards. With `fp8_param: false` the weights are
BF16/FP32 masters, so the same weights then run in BF16: the shadow pass of spec §2.1. With
`fp8_param: true` there is no BF16 copy of the weights to run, so the switch refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def _chunks(model: Any) -> list[torch.nn.Module]:
    if isinstance(model, torch.nn.Module):
        return [model]
    return list(model)


def transformer_configs(model: Any) -> list[Any]:
    """Distinct objects with an `fp8` attribute held as `.config` by any module of `model`."""
    seen: dict[int, Any] = {}
    for chunk in _chunks(model):
        for module in chunk.modules():
            cfg = getattr(module, "config", None)
            if cfg is not None and hasattr(cfg, "fp8") and id(cfg) not in seen:
                seen[id(cfg)] = cfg
    return list(seen.values())


class Fp8ComputeSwitch:
    """Remembers each config's FP8 setting while FP8 compute is off; idempotent both ways."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, Any]] | None = None

    @property
    def fp8_off(self) -> bool:
        return self._saved is not None

    def set(self, model: Any, enabled: bool) -> int:
        """FP8 compute on (`enabled`) or off for `model`; returns how many configs were changed."""
        if not enabled:
            return self._disable(transformer_configs(model))
        return self._restore()

    def _disable(self, configs: Iterable[Any]) -> int:
        if self._saved is not None:
            return 0
        configs = list(configs)
        if any(getattr(c, "fp8_param", False) for c in configs):
            raise RuntimeError(
                "BF16 shadow pass impossible: parameters are stored in FP8 "
                "(policy.megatron_cfg.fp8_cfg.fp8_param: true). Set fp8_param: false to calibrate."
            )
        self._saved = [(c, c.fp8) for c in configs]
        for cfg in configs:
            cfg.fp8 = None
        return len(configs)

    def _restore(self) -> int:
        if self._saved is None:
            return 0
        for cfg, value in self._saved:
            cfg.fp8 = value
        count, self._saved = len(self._saved), None
        return count
