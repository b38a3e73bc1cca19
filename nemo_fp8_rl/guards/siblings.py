"""Which GPU family a recipe runs on, and its sibling recipe for the other family.

A recipe is Blackwell-only when it uses MXFP8 (`fp8_cfg.fp8_recipe: mxfp8`, `vllm_cfg.is_mx`),
Hopper-only when its blockwise FP8 training keeps FP32 block scales
(`NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`: Transformer Engine emulates blockwise scaling with
MXFP8 on Blackwell, which needs power-of-2 scales) or its block-FP8 rollout uses DeepGEMM with
the FP32 scales NeMo RL forces (`use_deep_gemm`: `VLLM_USE_DEEP_GEMM_E8M0=0`); else either.

The sibling is found by a name rule, for any recipe folder: recipes are named
`<algo>-<model>-<N>n<G>g-<variant>` (README, "Recipes"). Two recipes are siblings when their
names are equal once the cluster token (`1n8g`) and the precision tokens (`fp8`, `bf16`,
`mxfp8`, `blockwise`, `tensorwise`, `rollout`, ...) are taken out: the variant's other tokens
(`uncalibrated`, `async-1off`, `kvcache`, `16k`) must match. Among the siblings that run on the
target family, one that trains in FP8 as this one does is preferred, then one with FP8 rollout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config import RecipeError, load_recipe
from nemo_fp8_rl.config.gpus import BLACKWELL, HOPPER
from nemo_fp8_rl.config.locations import portable_name
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.guards.context import get_key

PRECISION_TOKENS = frozenset(
    {
        "fp8",
        "bf16",
        "mxfp8",
        "mx",
        "blockwise",
        "tensorwise",
        "rollout",
        "rollouts",
        "e2e",
        "fp32",
        "pow2",
        "e8m0",
        "nvfp4",
        "fp4",
        "hopper",
        "blackwell",
        "b200",
        "gb200",
        "h100",
        "h200",
    }
)
CLUSTER = re.compile(r"^\d+n\d+g$")
FAMILY_NAMES = {HOPPER: "Hopper", BLACKWELL: "Blackwell"}


def family_of(cfg: dict[str, Any]) -> str | None:
    """`hopper`, `blackwell`, or None when the recipe runs on either (module docstring)."""
    fp8 = get_key(cfg, "policy.megatron_cfg.fp8_cfg") or {}
    training = bool(fp8.get("enabled")) and bool(get_key(cfg, "policy.megatron_cfg.enabled"))
    vllm = get_key(cfg, "policy.generation.vllm_cfg") or {}
    rollout = vllm.get("precision") == "fp8"
    if (training and fp8.get("fp8_recipe") == "mxfp8") or (rollout and vllm.get("is_mx")):
        return BLACKWELL
    env = get_key(cfg, "policy.megatron_cfg.env_vars") or {}
    fp32 = str(env.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0")) == "1"
    if training and fp8.get("fp8_recipe", "blockwise") == "blockwise" and fp32:
        return HOPPER
    if rollout and vllm.get("use_deep_gemm") and not vllm.get("pow2_weight_scaling_factors"):
        return HOPPER
    return None


def name_key(name: str) -> tuple[str, ...]:
    """A recipe's name without its cluster and precision tokens (module docstring)."""
    stem = Path(name).name.removesuffix(".yaml")
    return tuple(
        t for t in stem.split("-") if t and not CLUSTER.match(t) and t not in PRECISION_TOKENS
    )


def _traits(cfg: dict[str, Any]) -> tuple[bool, bool]:
    fp8 = get_key(cfg, "policy.megatron_cfg.fp8_cfg") or {}
    vllm = get_key(cfg, "policy.generation.vllm_cfg") or {}
    return bool(fp8.get("enabled")), vllm.get("precision") == "fp8"


def sibling_for(
    recipe: Path, cfg: dict[str, Any], family: str, candidates: Iterable[Path] | None = None
) -> str | None:
    """The short name of `recipe`'s sibling that runs on `family` (None when there is none).

    Candidates are the recipes in `recipe`'s folder (or `candidates`) with the same name key
    and model; each is loaded to read its family.
    """
    recipe = Path(recipe).resolve()
    pool = list(candidates) if candidates is not None else sorted(recipe.parent.glob("*.yaml"))
    key, model = name_key(recipe.name), get_key(cfg, "policy.model_name")
    want = _traits(cfg)
    ranked = []
    for path in pool:
        if path.resolve() == recipe or name_key(path.name) != key:
            continue
        try:
            other = load_recipe(path).config
        except RecipeError:
            continue
        if get_key(other, "policy.model_name") != model or family_of(other) not in (family, None):
            continue
        traits = _traits(other)
        if not any(traits):
            continue  # a BF16 recipe is no FP8 sibling
        score = (traits[0] == want[0], traits[1] == want[1], family_of(other) == family)
        ranked.append((score, portable_name(path)))
    return max(ranked)[1] if ranked else None


def sibling_line(recipe: Path | None, cfg: dict[str, Any]) -> str | None:
    """`# GPUs: Hopper only; Blackwell sibling: <name>` for `recipes show` (None: either family,
    or a CPU recipe)."""
    family = family_of(cfg)
    if family is None or on_cpu(cfg):
        return None
    other = BLACKWELL if family == HOPPER else HOPPER
    name = sibling_for(recipe, cfg, other) if recipe is not None else None
    found = (
        f"{FAMILY_NAMES[other]} sibling: {name}"
        if name
        else f"no {FAMILY_NAMES[other]} sibling in its folder"
    )
    return f"# GPUs: {FAMILY_NAMES[family]} only; {found}"
