"""Every shipped recipe: resolves, validates, is minimal, is named after its cluster, and pairs fairly."""

from __future__ import annotations

import re

import pytest

from nemo_fp8_rl.analysis.recipe_diff import FORCED
from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
from nemo_fp8_rl.config.loader import leaf_sources, load_parents

RECIPES = find_recipes()
# recipes/study/: the CPU mechanism study's recipes (python -m nemo_fp8_rl.study), not a model's
STUDY = [p for p in RECIPES if p.parent.name == "study"]
# recipes/study/dose/: the precision dose study's recipes (scripts/dose_study.py)
DOSE = [p for p in RECIPES if p.parent.name == "dose" and p.parent.parent.name == "study"]
# recipes/study/rescue/: the 4-bit rescue study's arms (scripts/rescue_study.py)
RESCUE = [p for p in RECIPES if p.parent.name == "rescue" and p.parent.parent.name == "study"]
MODEL_RECIPES = [p for p in RECIPES if p not in STUDY and p not in DOSE and p not in RESCUE]
STUDY_NAME = re.compile(r"^grpo-study-(?P<variant>bf16|fp8(-[a-z0-9\-]+)?)$")
DOSE_NAME = re.compile(r"^grpo-dose-(bf16|(?P<fmt>fp8-block|mxfp8|nvfp4|mxfp4)(-uncalibrated)?)$")
NAME = re.compile(
    r"^(?P<algo>grpo|dapo)-(?P<model>[a-z0-9.\-]+)-(?P<where>\d+n\d+g|cpu)"
    r"(-async-(?P<age>\d+)off)?(-(?P<length>\d+k))?-(?P<variant>bf16|fp8(-[a-z0-9\-]+)?)$"
)
MODEL_DIRS = {
    "llama3.1-8b-instruct",
    "tiny-nemo",
    "qwen3-8b-base",
    "qwen3-4b",
    "qwen3-30b-a3b",
    "deepseek-v3",
    "moonlight-16b-a3b",
    "tiny",
}
PAPER = "paper-fp8-rl"
PAPER_MODELS = {"qwen3-8b-base", "qwen3-14b-base", "qwen2.5-32b"}
PRECISION_OVERLAYS = sorted((find_recipes()[0].parents[2] / "configs" / "precision").glob("*.yaml"))
# Keys a BF16/FP8 pair may differ in: precision, refit and calibration (plus the derived run paths).
PAIR_ALLOWED = (
    "policy.megatron_cfg.fp8_cfg.",
    "policy.megatron_cfg.env_vars.NVTE_",
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
    "policy.generation.vllm_cfg.precision",
    "policy.generation.vllm_cfg.kv_cache_dtype",
    "policy.generation.vllm_cfg.use_deep_gemm",
    "policy.generation.vllm_cfg.pow2_",
    "policy.generation.vllm_cfg.num_first_layers_in_bf16",
    "policy.generation.vllm_cfg.num_last_layers_in_bf16",
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
    "policy.generation.vllm_cfg.is_mx",
    *FORCED,  # forced by the FP8 engine, with the reason (compare shows them as `forced`)
    "loss_fn.calibration.",
    "refit.",
    "logger.log_dir",
    "logger.wandb.name",
    "logger.swanlab.name",
    "logger.mlflow.run_name",
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


def _model_dir(path) -> str:
    """`qwen3-8b-base` for recipes/qwen3-8b-base/x.yaml and recipes/paper-fp8-rl/qwen3-8b-base/x.yaml."""
    return path.parent.name


def test_every_model_has_recipes():
    top = {p.parent.name for p in MODEL_RECIPES if p.parent.parent.name != PAPER}
    paper = {p.parent.name for p in RECIPES if p.parent.parent.name == PAPER}
    assert top == MODEL_DIRS and paper == PAPER_MODELS
    assert len(RECIPES) >= 50


@pytest.mark.parametrize("path", MODEL_RECIPES, ids=short_name)
def test_recipe_validates_and_is_named_after_its_cluster(path):
    recipe = load_recipe(path)
    match = NAME.match(path.stem)
    assert match, f"{path.name} does not follow <algo>-<model>-<N>n<G>g|cpu-<variant>"
    assert match["model"] == _model_dir(path).replace("tiny", "tiny-qwen3")
    cluster = recipe.config["cluster"]
    if match["where"] == "cpu":
        assert cluster["gpus_per_node"] == 0
    else:
        nodes, gpus = map(int, match["where"][:-1].split("n"))
        assert (cluster["num_nodes"], cluster["gpus_per_node"]) == (nodes, gpus)
    async_grpo = recipe.config["grpo"]["async_grpo"]
    assert async_grpo["enabled"] == (match["age"] is not None), "async-<k>off names async GRPO"
    if match["age"] is not None:
        assert async_grpo["max_trajectory_age_steps"] == int(match["age"])
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
    for path in (p for p in RECIPES if p not in DOSE and p not in RESCUE):  # their own tests
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


def _scaling(stem: str) -> str:
    """The FP8 recipe a file name promises (blockwise unless it names another; `-fp8-mxfp8`:
    MXFP8 training and rollout, `-fp8-mxfp8-rollout`: MXFP8 rollout with BF16 training)."""
    return next((s for s in ("tensorwise", "mxfp8") if f"-fp8-{s}" in stem), "blockwise")


@pytest.mark.parametrize("path", [p for p in MODEL_RECIPES if "-fp8" in p.stem], ids=short_name)
def test_fp8_recipes_have_active_clipping_and_the_named_scaling(path):
    cfg = load_recipe(path).config
    samples = cfg["grpo"]["num_prompts_per_step"] * cfg["grpo"]["num_generations_per_prompt"]
    assert samples // cfg["policy"]["train_global_batch_size"] > 1
    fp8 = cfg["policy"]["megatron_cfg"]["fp8_cfg"]
    vllm = cfg["policy"]["generation"]["vllm_cfg"]
    assert vllm["is_mx"] == (_scaling(path.stem) == "mxfp8")
    if path.stem.endswith("-rollout"):  # FP8 rollout, BF16 training: nothing to calibrate
        assert not fp8["enabled"] and vllm["precision"] == "fp8"
        assert not cfg["loss_fn"]["calibration"]["enabled"]
        return
    assert fp8 == {
        **fp8,
        "enabled": True,
        "fp8": "e4m3",
        "fp8_recipe": _scaling(path.stem),
        "fp8_param": False,
    }
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert cfg["loss_fn"]["calibration"]["enabled"] == ("uncalibrated" not in path.stem)
    if path.parent.name != "tiny" and _scaling(path.stem) == "blockwise":
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


@pytest.mark.parametrize("path", DOSE, ids=short_name)
def test_dose_recipes_differ_from_bf16_in_precision_and_calibration_only(path):
    """Each dose arm is the BF16 dose recipe plus one precision overlay (and calibration)."""
    m = DOSE_NAME.match(path.stem)
    assert m, f"{path.name} does not follow grpo-dose-<format>[-uncalibrated]"
    cfg = load_recipe(path).config
    base = load_recipe(path.with_name("grpo-dose-bf16.yaml")).config
    assert cfg["grpo"]["max_num_steps"] == 150 and cfg["cluster"]["gpus_per_node"] == 0
    calibrated = m["fmt"] is not None and "uncalibrated" not in path.stem
    assert cfg["loss_fn"]["calibration"]["enabled"] == calibrated
    a, b = ({k: v for k, v in flat(c).items() if v != {}} for c in (base, cfg))
    differing = [k for k in set(a) | set(b) if a.get(k) != b.get(k)]
    allowed = (*PAIR_ALLOWED, "local.fp4", "loss_fn.calibration.", "refit.")
    assert not [k for k in differing if not k.startswith(allowed)]
    assert len(DOSE) == 9


BLACKWELL = [p for p in MODEL_RECIPES if re.search(r"-\d+n4g-", p.stem)]
# The Hopper recipe each Blackwell family is built on (its BF16 recipe's first parent).
HOPPER_OF = {
    "llama3.1-8b-instruct": "grpo-llama3.1-8b-instruct-1n8g",
    "qwen3-8b-base": "grpo-qwen3-8b-base-1n8g",
    "qwen3-4b": "grpo-qwen3-4b-1n8g",
    "qwen3-30b-a3b": "grpo-qwen3-30b-a3b-2n8g",
}


def test_every_blackwell_family_has_the_four_variants_and_a_hopper_sibling():
    """Per model: BF16, full MXFP8 calibrated and uncalibrated, MXFP8 rollout + BF16 training,
    on 4-GPU nodes with the Hopper recipe's GPU count; and the sibling rule (the name with its
    cluster token and `-mxfp8` taken out) finds the Hopper recipe of each MXFP8 variant."""
    by_model: dict[str, set[str]] = {}
    for path in BLACKWELL:
        m = NAME.match(path.stem)
        by_model.setdefault(path.parent.name, set()).add(m["variant"])
        hopper = path.parent / (
            re.sub(r"-\d+n4g-", "-", path.stem)
            .replace("-mxfp8", "")
            .replace(f"grpo-{path.parent.name}-", f"{HOPPER_OF[path.parent.name]}-")
            + ".yaml"
        )
        if not hopper.stem.endswith("-fp8-rollout"):  # no Hopper FP8-rollout recipe ships
            assert hopper.is_file(), f"{path.name}: no Hopper sibling {hopper.name}"
            a, b = load_recipe(path).config, load_recipe(hopper).config
            gpus = [c["cluster"]["num_nodes"] * c["cluster"]["gpus_per_node"] for c in (a, b)]
            assert gpus[0] == gpus[1] and a["cluster"]["gpus_per_node"] == 4
    want = {"bf16", "fp8-mxfp8", "fp8-mxfp8-uncalibrated", "fp8-mxfp8-rollout"}
    assert by_model == {model: want for model in HOPPER_OF}


MOE_FP8 = [
    "qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8",
    "qwen3-30b-a3b/grpo-qwen3-30b-a3b-4n4g-fp8-mxfp8",
    "deepseek-v3/grpo-deepseek-v3-32n8g-fp8",
    "deepseek-v3/grpo-deepseek-v3-64n8g-async-1off-fp8",
    "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8",
]


@pytest.mark.parametrize("name", MOE_FP8)
def test_moe_recipe_parallelism(name):
    """FP32 router, experts split, and the training groups tile the training GPUs (the whole
    cluster, less the generation nodes when generation is not colocated)."""
    cfg = load_recipe(name).config
    mcore = cfg["policy"]["megatron_cfg"]
    assert mcore["moe_router_dtype"] == "fp32"
    assert mcore["expert_model_parallel_size"] > 1
    nodes = cfg["cluster"]["num_nodes"]
    colocated = cfg["policy"]["generation"]["colocated"]
    if not colocated["enabled"]:
        nodes -= colocated["resources"]["num_nodes"]
    gpus = nodes * cfg["cluster"]["gpus_per_node"]
    model = mcore["tensor_model_parallel_size"] * mcore["pipeline_model_parallel_size"]
    assert gpus % model == 0 and (gpus // model) % mcore["expert_model_parallel_size"] == 0


@pytest.mark.parametrize(
    "name",
    ["deepseek-v3/grpo-deepseek-v3-32n8g-fp8", "moonlight-16b-a3b/grpo-moonlight-16b-a3b-4n8g-fp8"],
)
def test_mla_recipes_keep_the_low_rank_projections_bf16_in_vllm(name):
    """NeMo RL's MLA FP8 recipes: vLLM leaves every layer named *a_proj / *b_proj unquantized."""
    vllm = load_recipe(name).config["policy"]["generation"]["vllm_cfg"]
    assert vllm["quantization_ignored_layer_kws"] == ["a_proj", "b_proj"]
    assert vllm["use_deep_gemm"] is True


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


def _paper(model: str) -> list:
    return sorted(
        p.stem for p in RECIPES if p.parent.parent.name == PAPER and p.parent.name == model
    )


def test_paper_set_covers_the_study():
    """8B: 3 lengths x (BF16, tensorwise and blockwise FP8, each with and without calibration);
    14B DAPO and 32B GRPO: BF16 and blockwise FP8 with and without calibration."""
    variants = [
        "bf16",
        "fp8-blockwise",
        "fp8-blockwise-uncalibrated",
        "fp8-tensorwise",
        "fp8-tensorwise-uncalibrated",
    ]
    assert _paper("qwen3-8b-base") == sorted(
        f"grpo-qwen3-8b-base-1n8g-{n}-{v}" for n in ("4k", "8k", "16k") for v in variants
    )
    block = ["bf16", "fp8-blockwise", "fp8-blockwise-uncalibrated"]
    assert _paper("qwen3-14b-base") == [f"dapo-qwen3-14b-base-2n8g-8k-{v}" for v in block]
    assert _paper("qwen2.5-32b") == [f"grpo-qwen2.5-32b-4n8g-8k-{v}" for v in block]


@pytest.mark.parametrize(("length", "new_tokens"), [("4k", 4096), ("8k", 8192), ("16k", 16384)])
def test_paper_lengths_and_data(length, new_tokens):
    cfg = load_recipe(f"{PAPER}/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-{length}-bf16").config
    assert cfg["policy"]["generation"]["max_new_tokens"] == new_tokens
    assert (
        cfg["policy"]["max_total_sequence_length"]
        == new_tokens + cfg["data"]["max_input_seq_length"]
    )
    assert cfg["data"]["train"]["dataset_name"] == "DeepScaler"  # NeMo RL's registry name
    dapo = load_recipe(f"{PAPER}/qwen3-14b-base/dapo-qwen3-14b-base-2n8g-8k-bf16").config
    assert dapo["data"]["train"]["dataset_name"] == "DAPOMath17K"
    assert dapo["grpo"]["use_dynamic_sampling"] and dapo["loss_fn"]["ratio_clip_max"] == 0.28


@pytest.mark.parametrize(
    "overlay", [p for p in PRECISION_OVERLAYS if not p.stem.endswith("-cpu")], ids=lambda p: p.stem
)
def test_precision_overlay_on_a_bf16_recipe_is_a_fair_pair(overlay, tmp_path):
    """Every GPU overlay in configs/precision/ changes only precision and refit keys of a GPU
    recipe (the `-cpu` overlays are the embedded engine's 4-bit emulation, tested below)."""
    bf16 = find_recipes()[0].parents[1] / "qwen3-8b-base" / "grpo-qwen3-8b-base-1n8g-bf16.yaml"
    defaults = [str(bf16)] + (
        [str(overlay.with_name("fp8-blockwise.yaml"))] if overlay.stem == "fp8-kvcache" else []
    )
    child = tmp_path / f"grpo-x-1n8g-{overlay.stem}.yaml"
    child.write_text("defaults:\n" + "".join(f"  - {d}\n" for d in [*defaults, str(overlay)]))
    a = {k: v for k, v in flat(load_recipe(bf16).config).items() if v != {}}
    b = {k: v for k, v in flat(load_recipe(child).config).items() if v != {}}
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    assert differing and not [k for k in differing if not k.startswith(PAIR_ALLOWED)]


def test_mxfp8_overlay_keys_are_what_nemo_rl_and_megatron_read():
    cfg = load_recipe(
        f"{PAPER}/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-8k-bf16",
        [
            "policy.megatron_cfg.fp8_cfg.enabled=true",
            "policy.megatron_cfg.fp8_cfg.fp8_recipe=mxfp8",
            "policy.generation.vllm_cfg.precision=fp8",
            "policy.generation.vllm_cfg.is_mx=true",
        ],
    ).config
    assert cfg["policy"]["megatron_cfg"]["fp8_cfg"]["fp8_recipe"] == "mxfp8"


def test_mxfp8_on_cpu_loads_and_emulates_mxfp8_on_both_sides(tmp_path):
    from nemo_fp8_rl.engines.local import precision
    from nemo_fp8_rl.fp8 import FP8Spec

    tiny = find_recipes()[0].parents[1] / "tiny" / "grpo-tiny-qwen3-cpu-bf16.yaml"
    overlay = PRECISION_OVERLAYS[0].with_name("fp8-mxfp8.yaml")
    child = tmp_path / "grpo-tiny-qwen3-cpu-fp8-mxfp8.yaml"
    child.write_text(f"defaults:\n  - {tiny}\n  - {overlay}\n")
    cfg = load_recipe(child).config
    train = precision.TrainingPrecision.from_config(cfg)
    assert train.quantized and train.specs[0] == FP8Spec.preset("mxfp8")
    assert precision.receiver_quantizes(cfg) and precision.refit_scheme(cfg) == "bf16"


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_four_bit_overlays_change_only_local_fp4_of_a_cpu_recipe(kind, tmp_path):
    tiny = find_recipes()[0].parents[1] / "tiny" / "grpo-tiny-qwen3-cpu-bf16.yaml"
    overlay = PRECISION_OVERLAYS[0].with_name(f"{kind}-cpu.yaml")
    child = tmp_path / f"grpo-tiny-qwen3-cpu-{kind}.yaml"
    child.write_text(f"defaults:\n  - {tiny}\n  - {overlay}\n")
    from nemo_fp8_rl.config.schema import DERIVED, PATH_KEYS

    a, b = flat(load_recipe(tiny).config), flat(load_recipe(child).config)
    differing = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert sorted(differing - set(DERIVED) - set(PATH_KEYS)) == ["local.fp4"]


def test_four_bit_overlay_on_a_gpu_recipe_is_refused(tmp_path):
    bf16 = find_recipes()[0].parents[1] / "qwen3-8b-base" / "grpo-qwen3-8b-base-1n8g-bf16.yaml"
    overlay = PRECISION_OVERLAYS[0].with_name("nvfp4-cpu.yaml")
    child = tmp_path / "grpo-x-1n8g-nvfp4.yaml"
    child.write_text(f"defaults:\n  - {bf16}\n  - {overlay}\n")
    with pytest.raises(ValueError, match="nvfp4 emulation runs on the embedded CPU engine only"):
        load_recipe(child)


# What each rescue arm may change on the dose arm it names as its parent (endpoints.yaml rescue:).
RESCUE_KEYS = {
    "noclip": ("loss_fn.ratio_clip_min", "loss_fn.ratio_clip_max"),
    "unfloored": ("loss_fn.calibration.low_floor",),
    "bf16-tail": ("policy.megatron_cfg.model_overrides.",
                  "policy.generation.vllm_cfg.num_last_layers_in_bf16"),
    "token-scale": ("local.fp4_activation_scale",),
    "four-over-six": ("local.fp4_four_over_six",),
}  # fmt: skip


@pytest.mark.parametrize("path", RESCUE, ids=short_name)
def test_rescue_arms_change_only_what_their_design_names(path):
    from nemo_fp8_rl.study import rescue_report

    arm = path.stem.removeprefix("grpo-rescue-")
    assert arm in rescue_report.arms(), f"{path.name}: not an arm of endpoints.yaml rescue:"
    kind = next(k for k in RESCUE_KEYS if arm.endswith(k))
    import yaml

    first = yaml.safe_load(path.read_text())["defaults"][0]  # the dose arm it builds on
    parent = (path.parent / first).resolve()
    assert parent.parent.name == "dose"
    a, b = ({k: v for k, v in flat(load_recipe(p).config).items() if v != {}}
            for p in (parent, path))  # fmt: skip
    differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    named = [k for k in differing if not k.startswith(("logger.", "checkpointing.checkpoint_dir"))]
    assert named and all(k.startswith(RESCUE_KEYS[kind]) for k in named), named
    assert len(RESCUE) == 9
