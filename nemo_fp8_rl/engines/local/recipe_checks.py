"""What stops the embedded engine before anything starts, in a module light enough to import
for a dry run or a submission (no torch, no Ray): `runner.run` and
`engines.choose.check_engine` both ask `check_cpu_support` and `refuse_hand_set_paths`."""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config import Problem, Recipe, RecipeError
from nemo_fp8_rl.config.rules import cpu_supported_features

TRAIN_RECIPES = (
    "blockwise",
    "tensorwise",
    "mxfp8",
)  # the FP8 training recipes the emulation reproduces


def check_cpu_support(cfg: dict[str, Any], recipe_name: str = "recipe") -> None:
    """Raise `RecipeError` listing every GPU-only feature the recipe asks of the CPU engine.

    The list of refused features is the config rule `cpu_supported_features` (also checked when
    the recipe is loaded); this adds the engine's own precondition, a CPU recipe, and the FP8
    training recipes the emulation reproduces exactly.
    """
    issues = []
    gpus = cfg["cluster"]["gpus_per_node"]
    if gpus != 0:
        issues.append(
            Problem(
                "cluster.gpus_per_node",
                f"the embedded engine runs on CPU, but the recipe asks for {gpus} GPUs per node",
                "set cluster.gpus_per_node=0, or run it with the NeMo RL engine (--engine nemo) on a GPU machine",
                "embedded CPU engine",
            )
        )
    fp8 = cfg["policy"]["megatron_cfg"].get("fp8_cfg") or {}
    if fp8.get("enabled") and fp8.get("fp8_recipe", "blockwise") not in TRAIN_RECIPES:
        issues.append(
            Problem(
                "policy.megatron_cfg.fp8_cfg.fp8_recipe",
                f"{fp8.get('fp8_recipe')!r} training is not emulated by the CPU engine",
                f"use one of {list(TRAIN_RECIPES)}",
                "embedded CPU engine",
            )
        )
    issues += cpu_supported_features(cfg, {})
    issues += _async_issues(cfg)
    issues += _nemo_refit_issues(cfg)
    if issues:
        raise RecipeError(recipe_name, issues)


def _async_issues(cfg: dict[str, Any]) -> list[Problem]:
    """Asynchronous GRPO and the async engine: NeMo RL's loop runs them (`--engine nemo`, also
    on CPU with a recipe under recipes/tiny-nemo/); the embedded engine is synchronous."""
    asks = (
        ("grpo.async_grpo.enabled", (cfg["grpo"].get("async_grpo") or {}).get("enabled")),
        (
            "policy.generation.vllm_cfg.async_engine",
            cfg["policy"]["generation"]["vllm_cfg"].get("async_engine"),
        ),
    )
    return [
        Problem(
            key,
            "the embedded engine runs synchronous GRPO",
            f"set {key}=false, or run NeMo RL's asynchronous loop with --engine nemo "
            "(on CPU: recipes/tiny-nemo/grpo-tiny-qwen3-nemo-cpu-async-1off-fp8)",
            "embedded CPU engine",
        )
        for key, value in asks
        if value
    ]


def _nemo_refit_issues(cfg: dict[str, Any]) -> list[Problem]:
    """`refit.quantize_on: trainer` is NeMo RL's refit path (`--engine nemo`, also on CPU with a
    recipe under recipes/tiny-nemo/); the embedded engine refits through `refit.bridge`."""
    if (cfg.get("refit") or {}).get("quantize_on", "generator") != "trainer":
        return []
    return [
        Problem(
            "refit.quantize_on",
            "quantize_on: trainer is a NeMo RL engine setting; the embedded engine refits "
            "through refit.bridge",
            "remove refit.quantize_on, or run NeMo RL's loop with --engine nemo (on CPU: "
            "recipes/tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8)",
            "embedded CPU engine",
        )
    ]


def refuse_hand_set_paths(recipe: Recipe) -> None:
    """The embedded engine keeps a run's logs and checkpoints under its run dir (eval, compare
    and --resume read them there); a NeMo RL config's own paths are for the NeMo RL engine."""
    from nemo_fp8_rl.config import RecipeError
    from nemo_fp8_rl.config.recipe import hand_set_paths

    issues = hand_set_paths(
        recipe,
        "the embedded engine writes logs and checkpoints under the run dir",
        "remove it and use --run-dir DIR (the NeMo RL engine, --engine nemo, writes there)",
    )
    if issues:
        raise RecipeError(recipe.name, issues)
