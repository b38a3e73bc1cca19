"""NeMo RL's own vLLM-side FP8 refit code, loaded from a NeMo RL source tree to verify against.

`load_nemo_rl_fp8(src)` executes `nemo_rl/models/generation/vllm/quantization/fp8.py` of the
tree as a standalone module (NeMo RL's package `__init__` chain, which needs vLLM, is not
imported). The file imports vLLM names at its top; each is bound to a minimal stand-in class
named `StandIn<Name>` (`FusedMoE`, `LinearBase`, `RoutedExperts`, `MoERunner`, `EngineCoreProc`,
`CoreEngineProcManager`, `init_logger`), and `vllm.triton_utils` to the real triton when it is
installed. The stand-ins sit in `sys.modules` only while the file executes, so a real vLLM
imported later is unaffected; the loaded module keeps them, and a test can build modules that
are instances of `module.LinearBase` etc. to drive `_is_fp8_weight` / `load_weights`.
7ea279a's import of its sibling `mxfp8_utils.py` is served by loading that real file.
`accelerate`, needed only inside `init_fp8`, and `ray`, needed only to patch a multi-GPU engine,
get stand-ins when they are not installed (vLLM's CPU environment holds neither).

`nemo_rl_cast` and `nemo_rl_expand_grouped` call NeMo RL's functions the way its `load_weights`
does (FP32 input, 128x128 blocks, the scale's trailing dim squeezed), with NeMo RL's
module-global `FP8Config` set for the pow2 rule.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import sys
import types
from pathlib import Path
from typing import Any

import torch

FP8_FILE = Path("nemo_rl/models/generation/vllm/quantization/fp8.py")
_PKG = "nemo_rl.models.generation.vllm.quantization"


def _stand_in_class(name: str, **attrs: Any) -> type:
    return type(f"StandIn{name}", (torch.nn.Module,), {"__module__": __name__, **attrs})


def _triton_stand_in() -> tuple[Any, Any]:
    try:
        import triton
        import triton.language as tl

        return tl, triton
    except ImportError:
        triton = types.SimpleNamespace(jit=lambda fn=None, **_: fn if fn else (lambda f: f))
        tl = types.SimpleNamespace(constexpr=int)
        return tl, triton


def _stand_in_modules(src: Path) -> dict[str, types.ModuleType]:
    """`sys.modules` entries for everything fp8.py imports that is not installed here."""
    tl, triton = _triton_stand_in()
    names: dict[str, dict[str, Any]] = {
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.model_executor.layers.fused_moe.layer": {"FusedMoE": _stand_in_class("FusedMoE")},
        "vllm.model_executor.layers.fused_moe.routed_experts": {
            "RoutedExperts": _stand_in_class("RoutedExperts")
        },
        "vllm.model_executor.layers.fused_moe.runner.moe_runner": {
            "MoERunner": _stand_in_class("MoERunner")
        },
        "vllm.model_executor.layers.linear": {"LinearBase": _stand_in_class("LinearBase")},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1.engine.core": {
            "EngineCoreProc": type("StandInEngineCoreProc", (), {"run_engine_core": None})
        },
        "vllm.v1.engine.utils": {
            "CoreEngineProcManager": type("StandInCoreEngineProcManager", (), {})
        },
    }
    out = {}
    for mod_name, attrs in names.items():
        module = types.ModuleType(mod_name, "stand-in for a vLLM module (nemo_reference.py)")
        module.__dict__.update(attrs)
        out[mod_name] = module
    try:
        import accelerate  # noqa: F401
    except ImportError:
        out["accelerate"] = types.ModuleType("accelerate", "stand-in (init_fp8 only)")
        out["accelerate"].init_empty_weights = contextlib.nullcontext
    try:
        import ray  # noqa: F401
    except ImportError:
        out["ray"] = types.ModuleType("ray", "stand-in (multi-GPU engine patching only)")
    sibling = src / FP8_FILE.parent / "mxfp8_utils.py"
    if sibling.is_file():
        out[f"{_PKG}.mxfp8_utils"] = _exec_file(sibling, f"{_PKG}.mxfp8_utils")
    return out


def _exec_file(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_nemo_rl_fp8(src: str | Path) -> types.ModuleType:
    """NeMo RL's fp8.py from the source tree `src` (the folder holding `nemo_rl/`), executed
    with vLLM stand-ins (module docstring). Raises FileNotFoundError naming the missing file."""
    src = Path(src)
    path = src / FP8_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: point the source at a NeMo RL tree (the folder with nemo_rl/)"
        )
    with contextlib.suppress(ImportError):
        import transformers  # noqa: F401  (before the stand-ins: it probes for accelerate)
    stand_ins = _stand_in_modules(src)
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        module = _exec_file(path, f"nemo_rl_fp8_reference_{abs(hash(str(path.resolve())))}")
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    module.source_tree = src
    return module


def set_pow2(module: types.ModuleType, pow2: bool) -> None:
    """Set NeMo RL's module-global FP8 config as `init_fp8` would for this pow2 setting."""
    module.global_fp8_config = module.FP8Config(use_weight_pow2_scale=pow2)


def nemo_rl_cast(
    module: types.ModuleType, weight: torch.Tensor, pow2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(q, scale_inv)` as NeMo RL's `load_weights` passes them to vLLM for one FP8 weight."""
    set_pow2(module, pow2)
    block = module.FP8_BLOCK_QUANT_KWARGS["weight_block_size"]
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a line for every padded weight
        q, scale = module.cast_tensor_to_fp8_blockwise(
            weight.to(torch.float), weight_block_size=block
        )
    return q, torch.squeeze(scale, dim=-1)


def nemo_rl_expand_grouped(
    module: types.ModuleType, key: str, weight: torch.Tensor, pow2: bool
) -> list[tuple[str, torch.Tensor]]:
    """NeMo RL's per-expert expansion of a grouped expert slab (7ea279a and later); raises
    AttributeError on a tree without `_expand_grouped_moe_expert_to_fp8` (v0.7.0)."""
    set_pow2(module, pow2)
    return list(module._expand_grouped_moe_expert_to_fp8(key, weight))
