"""The guard rails: every check, its failure class and upstream issue, and the runner of the
checks made before launch.

`PRE_LAUNCH` checks read the recipe, the model's `config.json`, the NeMo RL tree and the
workers' GPU type (`GuardContext`), and run in the preflight, `train` and `submit` before any
GPU is allocated. `AT_RUN_TIME` ones run inside a run (`served`: the generation side's layer
precisions at step 0 and after every refit; `health`: the train/generation mismatch per step).
docs/guard-rails.md is the catalogue users read; a test keeps it in step with `CATALOGUE`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_fp8_rl.guards import (
    alignment,
    field_checks,
    fp8_active,
    grouped_experts,
    memory,
    scale_format,
    upstream_bugs,
)
from nemo_fp8_rl.guards.assumed_gpu import assumed_worker, not_run_line
from nemo_fp8_rl.guards.context import GuardContext, NemoRLTree, WorkerGpu
from nemo_fp8_rl.guards.findings import CheckResult, GuardReport


@dataclass(frozen=True)
class Entry:
    """One check: its name, the failure class it guards, the upstream issue, when it runs."""

    check: str
    failure: str
    upstream: str
    when: str
    run: Callable[[GuardContext], CheckResult] | None = None


CATALOGUE: tuple[Entry, ...] = (
    Entry(
        "fp8-active",
        "FP8 not active: NeMo RL's FP8 patches miss the vLLM executor the engine path uses",
        fp8_active.UPSTREAM,
        "before launch",
        fp8_active.check,
    ),
    Entry(
        "scale-format",
        "scale formats mixed between trainer and rollout, or built for the other GPU family",
        scale_format.UPSTREAM,
        "before launch",
        scale_format.check,
    ),
    Entry(
        "alignment",
        "Transformer Engine divisibility assert in an FP8 GEMM (weights or tokens)",
        alignment.UPSTREAM,
        "before launch",
        alignment.check,
    ),
    Entry(
        "memory",
        "per-GPU memory over capacity; colocated KV cache sized by utilisation alone",
        "NVIDIA-NeMo/RL PR #3280, issue #3412",
        "before launch",
        memory.check,
    ),
    Entry(
        "fp8-param-tp",
        "fp8_param with blockwise FP8 at TP > 2: NaN mismatch from step 2",
        "NVIDIA-NeMo/RL#1164",
        "before launch",
        upstream_bugs.check_fp8_param,
    ),
    Entry(
        "fp8-kv-qk-norm",
        "FP8 KV cache on a model without QK-norm (warning)",
        "verl PR #4435",
        "before launch",
        upstream_bugs.check_kv_qk_norm,
    ),
    Entry(
        "grouped-experts-mxfp8",
        "grouped MoE expert slabs in an MXFP8 refit: NeMo RL 7ea279a's load_weights refuses them",
        grouped_experts.UPSTREAM,
        "before launch",
        grouped_experts.check,
    ),
    Entry(
        "kv-scales-refit",
        "FP8 KV cache on a colocated refit that drops the trainer's KV scales",
        field_checks.UPSTREAMS["kv-scales-refit"],
        "before launch",
        field_checks.check_kv_scales_refit,
    ),
    Entry(
        "hf-overrides",
        "the user's vllm_kwargs.hf_overrides dropped by FP8 set-up, or replacing FP8's quantization_config",
        field_checks.UPSTREAMS["hf-overrides"],
        "before launch",
        field_checks.check_hf_overrides,
    ),
    Entry(
        "layer-parity",
        "trainer and rollout running different layers in BF16 (warning)",
        field_checks.UPSTREAMS["layer-parity"],
        "before launch",
        field_checks.check_layer_parity,
    ),
    Entry(
        "pow2-on-hopper",
        "power-of-2 scales on Hopper workers (warning)",
        field_checks.UPSTREAMS["pow2-on-hopper"],
        "before launch",
        field_checks.check_pow2_on_hopper,
    ),
    Entry(
        "zero-block-scales",
        "an all-zero block quantized to a NaN/inf scale or an invalid E8M0 byte",
        field_checks.UPSTREAMS["zero-block-scales"],
        "before launch",
        field_checks.check_zero_block_scales,
    ),
    Entry(
        "pp-scale-names",
        "fp8_param scales re-synced under wrong names on pipeline stages > 0 (warning)",
        field_checks.UPSTREAMS["pp-scale-names"],
        "before launch",
        field_checks.check_pp_scale_names,
    ),
    Entry(
        "served-precision",
        "FP8 layers served in BF16 by the generation engine",
        fp8_active.UPSTREAM,
        "step 0 and after every refit",
    ),
    Entry(
        "health",
        "train/generation mismatch outside its healthy range for K steps",
        "NVIDIA-NeMo/RL PR #3754, #2744, #3566, #4080, #1801",
        "every step",
    ),
)
PRE_LAUNCH = tuple(e for e in CATALOGUE if e.run is not None)


def guard_context(
    recipe: Any,
    hf: dict[str, Any] | None,
    nemo_rl_tree: Path | None,
    worker: WorkerGpu | None,
) -> GuardContext:
    """The context of a loaded `Recipe` (config, provenance, path)."""
    return GuardContext(
        config=recipe.config,
        provenance=dict(recipe.provenance),
        hf=hf,
        nemo_rl=NemoRLTree.read(nemo_rl_tree),
        worker=worker,
        recipe_path=Path(recipe.path) if getattr(recipe, "path", None) else None,
    )


def run_checks(ctx: GuardContext, name: str = "recipe") -> GuardReport:
    """Every pre-launch check on `ctx`, in catalogue order. A GPU recipe whose workers' GPU
    is unknown is checked for the smallest GPU of the family it declares (`assumed_gpu`), or
    gets the line naming the checks that could not run."""
    report = GuardReport(name)
    if ctx.worker is None and ctx.on_gpu:
        assumed = assumed_worker(ctx.config)
        if assumed is not None:
            ctx = dataclasses.replace(ctx, worker=assumed)
        else:
            report.not_run = not_run_line(ctx.fp8_training or ctx.fp8_rollout)
    for entry in PRE_LAUNCH:
        assert entry.run is not None
        report.results.append(entry.run(ctx))
    return report
