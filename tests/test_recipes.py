"""Every shipped recipe: resolves, validates, is minimal, is named after its cluster, and pairs fairly."""

from __future__ import annotations

import re

import pytest

from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
from nemo_fp8_rl.config.loader import leaf_sources, load_parents

RECIPES = find_recipes()
# recipes/study/: the CPU mechanism study's recipes (python -m nemo_fp8_rl.study), not a model's
STUDY = [p for p in RECIPES if p.parent.name == "study"]
MODEL_RECIPES = [p for p in RECIPES if p.parent.name != "study"]
NAME = re.compile(
    r"^(?P<algo>grpo)-(?P<model>[a-z0-9.\-]+)-(?P<where>\d+n\d+g|cpu)-(?P<variant>bf16|fp8(-[a-z0-9\-]+)?)$"
)
STUDY_NAME = re.compile(r"^grpo-study-(?P<variant>bf16|fp8(-[a-z0-9\-]+)?)$")
MODEL_DIRS = {"llama3.1-8b-instruct", "qwen3-8b-base", "qwen3-4b", "qwen3-30b-a3b", "tiny"}
# Keys a BF16/FP8 pair may differ in: precision, refit and calibration (plus the derived run paths).
PAIR_ALLOWED = (
    "policy.megatron_cfg.fp8_cfg.",
    "policy.megatron_cfg.env_vars.NVTE_",
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
    "policy.generation.vllm_cfg.precision",
    "policy.generation.vllm_cfg.kv_cache_dtype",
    "policy.generation.vllm_cfg.use_deep_gemm",
    "policy.generation.vllm_cfg.gpu_memory_utilization",
    "policy.generation.vllm_cfg.pow2_",
    "policy.generation.vllm_cfg.num_first_layers_in_bf16",
    "policy.generation.vllm_cfg.num_last_layers_in_bf16",
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
    "loss_fn.calibration.",
    "refit.",
    "logger.log_dir",
    "logger.wandb.name",
    "checkpointing.checkpoint_dir",
)


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_every_model_has_recipes():
    assert {p.parent.name for p in MODEL_RECIPES} == MODEL_DIRS
    assert len(RECIPES) >= 16


@pytest.mark.parametrize("path", MODEL_RECIPES, ids=short_name)
def test_recipe_validates_and_is_named_after_its_cluster(path):
    recipe = load_recipe(path)
    match = NAME.match(path.stem)
    assert match, f"{path.name} does not follow <algo>-<model>-<N>n<G>g|cpu-<variant>"
    assert match["model"] == path.parent.name.replace("tiny", "tiny-qwen3")
    cluster = recipe.config["cluster"]
    if match["where"] == "cpu":
        assert cluster["gpus_per_node"] == 0
    else:
        nodes, gpus = map(int, match["where"][:-1].split("n"))
        assert (cluster["num_nodes"], cluster["gpus_per_node"]) == (nodes, gpus)
    assert recipe.config["logger"]["log_dir"] == f"runs/{path.stem}/logs"
    assert recipe.config["checkpointing"]["checkpoint_dir"] == f"runs/{path.stem}/checkpoints"


@pytest.mark.parametrize("path", RECIPES, ids=short_name)
def test_recipe_is_minimal(path):
    """A recipe holds only what differs from its parents (NeMo RL's minimize-check)."""
    parents, _, own = load_parents(path)
    inherited = flat(parents)
    redundant = [k for k, v in flat(own).items() if k in inherited and inherited[k] == v]
    assert not redundant, f"{path.name} repeats inherited values: {redundant}"


def _pairs():
    for path in RECIPES:
        variant = (STUDY_NAME if path in STUDY else NAME).match(path.stem)["variant"]
        if variant.startswith("fp8"):
            sibling = path.with_name(path.stem.replace(f"-{variant}", "-bf16") + ".yaml")
            yield pytest.param(sibling, path, id=short_name(path))


@pytest.mark.parametrize(("bf16", "fp8"), list(_pairs()))
def test_pair_differs_only_in_precision_refit_calibration(bf16, fp8):
    a, b = ({k: v for k, v in flat(load_recipe(p).config).items() if v != {}} for p in (bf16, fp8))
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    unfair = [k for k in differing if not k.startswith(PAIR_ALLOWED)]
    assert not unfair, (
        f"{fp8.name} vs {bf16.name} differ outside precision/refit/calibration: {unfair}"
    )
    assert "policy.generation.vllm_cfg.precision" in differing


@pytest.mark.parametrize("path", [p for p in MODEL_RECIPES if "-fp8" in p.stem], ids=short_name)
def test_fp8_recipes_have_active_clipping_and_block_scaling(path):
    cfg = load_recipe(path).config
    samples = cfg["grpo"]["num_prompts_per_step"] * cfg["grpo"]["num_generations_per_prompt"]
    assert samples // cfg["policy"]["train_global_batch_size"] > 1
    fp8 = cfg["policy"]["megatron_cfg"]["fp8_cfg"]
    assert fp8 == {
        **fp8,
        "enabled": True,
        "fp8": "e4m3",
        "fp8_recipe": "blockwise",
        "fp8_param": False,
    }
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert cfg["loss_fn"]["calibration"]["enabled"] == ("uncalibrated" not in path.stem)
    if path.parent.name != "tiny":
        assert (
            cfg["policy"]["megatron_cfg"]["env_vars"]["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
        )


@pytest.mark.parametrize("path", STUDY, ids=short_name)
def test_study_recipes_are_cpu_runs_of_the_tiny_model(path):
    """The study's FP8 recipes train with per-tensor current scaling (docs/study/README.md)."""
    assert STUDY_NAME.match(path.stem), f"{path.name} does not follow grpo-study-<variant>"
    cfg = load_recipe(path).config
    assert cfg["cluster"]["gpus_per_node"] == 0
    samples = cfg["grpo"]["num_prompts_per_step"] * cfg["grpo"]["num_generations_per_prompt"]
    assert samples // cfg["policy"]["train_global_batch_size"] > 1
    fp8 = cfg["policy"]["megatron_cfg"]["fp8_cfg"]
    assert fp8["enabled"] == ("-fp8" in path.stem)
    if fp8["enabled"]:
        assert fp8["fp8_recipe"] == "tensorwise"
        assert cfg["loss_fn"]["calibration"]["enabled"] == ("uncalibrated" not in path.stem)
    assert {p.stem for p in STUDY} >= {
        "grpo-study-bf16",
        "grpo-study-fp8-uncalibrated",
        "grpo-study-fp8",
    }


def test_moe_recipe_parallelism():
    cfg = load_recipe("qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8").config
    mcore = cfg["policy"]["megatron_cfg"]
    assert mcore["moe_router_dtype"] == "fp32"
    assert mcore["expert_model_parallel_size"] > 1
    gpus = cfg["cluster"]["num_nodes"] * cfg["cluster"]["gpus_per_node"]
    assert gpus % (mcore["tensor_model_parallel_size"] * mcore["pipeline_model_parallel_size"]) == 0


def test_provenance_names_the_file_that_set_each_key():
    recipe = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8")
    prov = recipe.provenance
    assert prov["policy.megatron_cfg.fp8_cfg.enabled"].endswith(
        "configs/precision/fp8-blockwise.yaml"
    )
    assert prov["grpo.max_num_steps"].endswith("recipes/tiny/grpo-tiny-qwen3-cpu-bf16.yaml")
    assert prov["loss_fn.ratio_clip_min"].endswith("configs/base/grpo.yaml")
    assert prov["loss_fn.calibration.enabled"].endswith("configs/loss/calibrated-clipping.yaml")
    assert set(leaf_sources(recipe.config, "x")) <= set(prov) | {"logger.wandb.project"}
