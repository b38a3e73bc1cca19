"""Preflight for `refit.quantize_on: trainer`: the refit metadata against vLLM's FP8 weight list.

On a GPU cluster the first refit would fail in `prepare_refit_info` when the pairs the Megatron
worker plans do not match what vLLM holds in FP8 (`vllm_refit.check_refit_info`). The preflight
finds that first, on CPU:

1. the export: the HF weight names and shapes of the recipe's model, from its shipped
   `config.json`: for a MoE model trained by Megatron, Megatron-Bridge's names (per expert for
   Qwen3-MoE and DeepSeek-V3, `guards.grouped_experts`), else a transformers model built on the
   meta device, no weights;
2. the metadata step: `trainer_refit.plan_layout` + `shape_only`, the code the worker's
   `prepare_refit_info` runs, under the recipe's `policy.generation.vllm_cfg`;
3. vLLM's FP8 list: the linear and expert weights (the project's layout with no layer kept in
   BF16) minus the modules NeMo RL's real `init_fp8` lists in `hf_overrides.quantization_config
   .ignored_layers` of the `vllm.LLM(...)` arguments the rehearsal recorded (vLLM skips a fused
   expert layer when any of its experts is listed);
4. `check_refit_info(metadata, vLLM's list)`: every problem becomes one located error, at NeMo
   RL's `_is_fp8_weight` (where vLLM's side decides what is FP8).

So the check is independent where the two sides can disagree: which layers `init_fp8` keeps in
BF16 (`num_first/last_layers_in_bf16`, `quantization_ignored_layer_kws`) and the quantization
config vLLM is given; the set of linear weights itself is the project's reading of vLLM's layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.nemo.preflight.located import LocatedError
from nemo_fp8_rl.engines.nemo.worker.trainer_refit import plan_layout, rules_for_worker, shape_only
from nemo_fp8_rl.engines.nemo.worker.vllm_refit import (
    GROUPED_SLABS,
    check_refit_info,
)
from nemo_fp8_rl.refit.errors import RefitMismatch
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules

KEY = "refit.quantize_on"
FP8_FILE = "nemo_rl/models/generation/vllm/quantization/fp8.py"
DECIDES = "def _is_fp8_weight"


def export_shapes(
    hf_config: Mapping[str, Any], megatron: bool = True
) -> list[tuple[str, torch.Tensor]]:
    """(HF name, meta tensor) of every weight the trainer's refit exports, in BF16: for a MoE
    model the Megatron worker sends what Megatron-Bridge's bridge names, per expert for the
    families `hf_shapes` covers (`guards.grouped_experts.bridge_exports_grouped`), not the
    grouped slabs transformers 5 holds; else the transformers model's own parameter names."""
    from nemo_fp8_rl.guards.grouped_experts import has_experts, trainer_sends_grouped
    from nemo_fp8_rl.refit.hf_shapes import hf_weight_shapes

    if has_experts(hf_config) and not trainer_sends_grouped(hf_config, megatron):
        return [
            (n, torch.empty(shape, dtype=torch.bfloat16, device="meta"))
            for n, shape in hf_weight_shapes(hf_config)
        ]
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**dict(hf_config))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return [(n, p) for n, p in model.named_parameters()]


def _layer_of(module: str) -> str:
    """`model.layers.<i>.` of a module name ('' outside the decoder layers)."""
    parts = module.split(".")
    return ".".join(parts[:3]) + "." if parts[:2] == ["model", "layers"] else ""


def vllm_fp8_names(names: list[str], num_layers: int, ignored: list[str]) -> set[str]:
    """Names vLLM holds in FP8: linear/expert weights not in `ignored` (module names); an expert
    layer is skipped whole when any of its experts is listed."""
    linear = NemoFp8Layout(names, NemoFp8Rules(num_layers=num_layers))
    # vLLM tests `prefix in ignored_layers`: an entry that is not a string (v0.7.0's init_fp8
    # appends a list per layer range, fp8.py:214) matches no module
    ignored_set = {m for m in ignored if isinstance(m, str)}
    skipped_expert_layers = {_layer_of(m) for m in ignored_set if ".mlp.experts." in m}
    out = set()
    for name in names:
        module = name.removesuffix(".weight")
        expert = ".mlp.experts." in name
        if expert and _layer_of(module) in skipped_expert_layers:
            continue
        if (
            name.endswith(GROUPED_SLABS)
            and linear.expands(name)
            or linear.is_fp8(name)
            and module not in ignored_set
        ):
            out.add(name)
    return out


def _line(tree: Path) -> int:
    path = tree / FP8_FILE
    if path.is_file():
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if text.startswith(DECIDES):
                return number
    return 0


def _error(tree: Path, message: str, fix: str) -> LocatedError:
    return LocatedError(KEY, FP8_FILE, _line(tree), message, fix)


def _served_scheme(llm_kwargs: Mapping[str, Any], qcfg: Mapping[str, Any]) -> str | None:
    """What FP8 weights vLLM is built with: "block" (128x128), "mxfp8" (ModelOpt MXFP8, NeMo RL's
    `is_mx`) or None."""
    if llm_kwargs.get("quantization") != "fp8":
        return None
    if qcfg.get("quant_algo") == "MXFP8":
        return "mxfp8"
    return "block" if qcfg.get("weight_block_size") == [128, 128] else None


def refit_findings(
    config: Mapping[str, Any],
    llm_kwargs: Mapping[str, Any] | None,
    hf_config: Mapping[str, Any],
    tree: Path,
) -> list[LocatedError]:
    """Located errors of the trainer-side FP8 refit for this recipe (empty: it matches)."""
    if (config.get("refit") or {}).get("quantize_on") != "trainer" or llm_kwargs is None:
        return []
    fix = f"set {KEY}: generator, or align policy.generation.vllm_cfg with the model"
    qcfg = (llm_kwargs.get("hf_overrides") or {}).get("quantization_config") or {}
    megatron = bool(((config.get("policy") or {}).get("megatron_cfg") or {}).get("enabled"))
    export = export_shapes(hf_config, megatron)
    num_layers = int(hf_config["num_hidden_layers"])
    try:
        rules = rules_for_worker(config["policy"], num_layers)
        _, entries = plan_layout(export, rules)
    except UserError as exc:  # the worker's prepare_refit_info would stop the same way
        return [_error(tree, f"{exc.where}: {exc.what}", exc.fix)]
    served = _served_scheme(llm_kwargs, qcfg)
    if served != ("mxfp8" if rules.mx else "block"):
        return [
            _error(
                tree,
                f"vLLM is given quantization={llm_kwargs.get('quantization')!r} with "
                f"{ {k: qcfg.get(k) for k in ('weight_block_size', 'quant_algo')} }: it serves "
                f"{served or 'no FP8 weights'}, the trainer's pairs are "
                f"{'MXFP8' if rules.mx else '128x128 block FP8'}",
                fix,
            )
        ]
    metadata = {n: (t.shape, t.dtype) for n, t in shape_only(entries)}
    vllm = vllm_fp8_names(
        [n for n, _ in export], num_layers, list(qcfg.get("ignored_layers") or [])
    )
    try:
        check_refit_info(metadata, vllm.__contains__, where="preflight", mx=rules.mx)
    except RefitMismatch as exc:
        shown = "; ".join(exc.problems[:6]) + ("; ..." if len(exc.problems) > 6 else "")
        return [
            _error(
                tree,
                f"the trainer's FP8 refit metadata does not match vLLM's FP8 weights "
                f"({len(exc.problems)} problem(s)): {shown}",
                fix,
            )
        ]
    return []
