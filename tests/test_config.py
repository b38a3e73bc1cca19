"""Config loading: defaults chain semantics, overrides, interpolation, schema and every rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.config import RecipeError, load_recipe, project_root
from nemo_fp8_rl.config.interpolate import resolve_all
from nemo_fp8_rl.config.loader import load_chain

ROOT = project_root()
TINY_BF16 = ROOT / "recipes/tiny/grpo-tiny-qwen3-cpu-bf16.yaml"
TINY_FP8 = ROOT / "recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml"
QWEN_FP8 = ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8.yaml"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def bad(tmp_path: Path, parent: Path, body: str) -> list[str]:
    """Load a recipe that inherits `parent` and adds `body`; return the issue lines."""
    path = write(tmp_path, "bad.yaml", f"defaults: {parent}\n{body}")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert all(i.file != "?" for i in info.value.issues)
    return [str(i) for i in info.value.issues]


# --- defaults chain (NeMo RL semantics) -------------------------------------------------------


def test_defaults_order_dict_merge_list_replace_and_override(tmp_path):
    write(tmp_path, "a.yaml", "x: {p: 1, q: [1, 2], r: {s: 1}}\nn: a\n")
    write(tmp_path, "b.yaml", "x: {p: 2}\nn: b\n")
    write(
        tmp_path, "c.yaml", "defaults: [a.yaml, b.yaml]\nx: {q: [9], r: {_override_: true, t: 2}}\n"
    )
    config, prov = load_chain(tmp_path / "c.yaml")
    assert config == {"x": {"p": 2, "q": [9], "r": {"t": 2}}, "n": "b"}
    assert (
        prov["x.p"].endswith("b.yaml")
        and prov["x.q"].endswith("c.yaml")
        and prov["n"].endswith("b.yaml")
    )
    assert "x.r.s" not in prov and prov["x.r.t"].endswith("c.yaml")


def test_defaults_string_relative_and_cycle(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "sub/p.yaml", "k: 1e-6\n")
    write(tmp_path, "child.yaml", "defaults: sub/p.yaml\n")
    config, _ = load_chain(tmp_path / "child.yaml")
    assert config == {"k": 1e-6} and isinstance(config["k"], float)
    write(tmp_path, "loop1.yaml", "defaults: loop2.yaml\n")
    write(tmp_path, "loop2.yaml", "defaults: loop1.yaml\n")
    with pytest.raises(RecipeError, match="cycle in defaults chain"):
        load_chain(tmp_path / "loop1.yaml")


def test_missing_parent_names_the_file(tmp_path):
    path = write(tmp_path, "r.yaml", "defaults: nowhere.yaml\n")
    with pytest.raises(RecipeError, match="parent 'nowhere.yaml' not found"):
        load_recipe(path)


def test_interpolation_absolute_relative_and_resolvers():
    config = {"a": {"n": 4, "m": "${mul:${a.n}, 2}", "r": "${.n}", "s": "x${a.n}y"}, "b": "${a.m}"}
    resolved, issues = resolve_all(config)
    assert not issues
    assert resolved == {"a": {"n": 4, "m": 8, "r": 4, "s": "x4y"}, "b": 8}
    _, issues = resolve_all({"a": "${nope.key}", "c": "${c}"})
    assert [i.key for i in issues] == ["a", "c"]


# --- overrides, lookup, derived keys -----------------------------------------------------------


def test_overrides_are_typed_and_recorded():
    recipe = load_recipe(
        "tiny/grpo-tiny-qwen3-cpu-fp8",
        ["grpo.max_num_steps=7", "policy.megatron_cfg.optimizer.lr=3e-4"],
    )
    assert recipe.config["grpo"]["max_num_steps"] == 7
    assert recipe.config["policy"]["megatron_cfg"]["optimizer"]["lr"] == 3e-4
    assert recipe.provenance["grpo.max_num_steps"] == "override"
    # interpolations see overrides: max_new_tokens default follows the sequence length in the base
    qwen = load_recipe(QWEN_FP8, ["policy.max_total_sequence_length=2048"])
    assert qwen.config["policy"]["generation"]["vllm_cfg"]["max_model_len"] == 2048


def test_override_errors_are_reported_with_the_schema():
    with pytest.raises(RecipeError) as info:
        load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", ["grpo.max_num_steps=ten", "nonsense"])
    text = str(info.value)
    assert "override: grpo.max_num_steps: expected integer, got string ('ten')" in text
    assert "nonsense: malformed override" in text


def test_lookup_by_short_name_stem_and_path():
    assert load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8").path == QWEN_FP8
    assert load_recipe("grpo-qwen3-8b-base-1n8g-fp8").path == QWEN_FP8
    assert load_recipe(str(QWEN_FP8)).name == "grpo-qwen3-8b-base-1n8g-fp8"
    with pytest.raises(RecipeError, match="no such recipe file or name"):
        load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp16")


def test_run_paths_are_derived_not_written(tmp_path):
    recipe = load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16", run_dir=tmp_path / "r")
    assert recipe.config["logger"]["log_dir"] == str(tmp_path / "r" / "logs")
    assert recipe.config["logger"]["wandb"]["name"] == "grpo-tiny-qwen3-cpu-bf16"
    lines = bad(tmp_path, TINY_BF16, "logger:\n  wandb:\n    name: mine\n")
    assert any(
        "logger.wandb.name: is derived from the recipe name and --run-dir, not set by hand" in line
        and "remove it; the run name" in line
        for line in lines
    )


def test_output_paths_set_by_hand_are_kept(tmp_path, monkeypatch):
    """NeMo RL configs set `logger.log_dir` / `checkpointing.checkpoint_dir`: kept (absolute
    from the working directory, as NeMo RL resolves them), the source recorded."""
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(TINY_BF16, ["checkpointing.checkpoint_dir=results/grpo"], run_dir="r")
    assert recipe.config["checkpointing"]["checkpoint_dir"] == str(tmp_path / "results" / "grpo")
    assert recipe.provenance["checkpointing.checkpoint_dir"] == "override"
    assert recipe.config["logger"]["log_dir"] == "r/logs"
    assert recipe.provenance["logger.log_dir"] == "derived"


# --- schema -----------------------------------------------------------------------------------


def test_misspelt_key_gets_did_you_mean(tmp_path):
    lines = bad(tmp_path, QWEN_FP8, "policy:\n  generaton:\n    vllm_cfg:\n      precision: fp8\n")
    assert lines == [
        f"{tmp_path / 'bad.yaml'}: policy.generaton: unknown key (not in the base config or the project schema). "
        "Fix: did you mean policy.generation?"
    ]


def test_keys_nemo_rl_reads_only_when_present_are_typed_not_unknown(tmp_path):
    """`moe_grouped_gemm` / `sequence_packing.fuse_loss`: absent from the base (NeMo RL's own
    default then applies), accepted when set, type-checked like any key."""
    body = "policy:\n  sequence_packing:\n    fuse_loss: 'yes'\n"
    (line,) = bad(tmp_path, QWEN_FP8, body)
    assert "policy.sequence_packing.fuse_loss: expected bool, got string ('yes')" in line
    assert "remove the key to keep NeMo RL's default" in line
    assert "moe_grouped_gemm" not in load_recipe(QWEN_FP8).config["policy"]["megatron_cfg"]


def test_misspelt_project_key_and_type_and_range_and_choice(tmp_path):
    body = (
        "loss_fn:\n  ratio_clip_min: 1.5\n  calibration:\n    intervall: 5\n"
        "grpo:\n  seed: '7'\n"
        "policy:\n  megatron_cfg:\n    fp8_cfg:\n      fp8_recipe: rowwise\n"
    )
    text = "\n".join(bad(tmp_path, TINY_FP8, body))
    assert (
        "loss_fn.calibration.intervall: unknown key (not in the project schema). Fix: did you mean loss_fn.calibration.interval?"
        in text
    )
    assert "grpo.seed: expected integer, got string ('7')" in text
    assert "loss_fn.ratio_clip_min: value 1.5 out of range. Fix: use a value in (0, 1]" in text
    assert (
        "policy.megatron_cfg.fp8_cfg.fp8_recipe: value 'rowwise' is not one of 'blockwise', 'tensorwise', 'mxfp8'"
        in text
    )


def test_all_errors_reported_at_once(tmp_path):
    lines = bad(tmp_path, TINY_FP8, "grpo:\n  max_num_step: 3\n  val_perod: 2\n")
    assert len(lines) == 2


# --- cross-field rules: one failing example each, message checked ------------------------------

RULE_CASES = {
    "fp8_rollout_needs_is": (
        QWEN_FP8,
        "loss_fn:\n  use_importance_sampling_correction: false\n  truncated_importance_sampling_type: null\n",
        "loss_fn.use_importance_sampling_correction: FP8 rollout (vllm_cfg.precision: fp8) without importance-sampling correction. Fix: set loss_fn.use_importance_sampling_correction: true",
    ),
    "kv_cache_needs_fp8": (
        ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16.yaml",
        "policy:\n  generation:\n    vllm_cfg:\n      kv_cache_dtype: fp8\n",
        "policy.generation.vllm_cfg.kv_cache_dtype: kv_cache_dtype fp8 needs FP8 rollout. Fix: set policy.generation.vllm_cfg.precision: fp8 or kv_cache_dtype: auto",
    ),
    "kv_cache_no_async": (
        ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache.yaml",
        "policy:\n  generation:\n    vllm_cfg:\n      async_engine: true\n",
        "policy.generation.vllm_cfg.async_engine: FP8 KV cache does not support the async vLLM engine. Fix: set policy.generation.vllm_cfg.async_engine: false",
    ),
    "kv_cache_pp1": (
        ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache.yaml",
        "policy:\n  megatron_cfg:\n    pipeline_model_parallel_size: 2\n",
        "policy.megatron_cfg.pipeline_model_parallel_size: FP8 KV cache needs pipeline parallel size 1",
    ),
    "kv_cache_megatron": (
        ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-kvcache.yaml",
        "policy:\n  dtensor_cfg:\n    enabled: true\n",
        "policy.generation.vllm_cfg.kv_cache_dtype: FP8 KV cache needs the Megatron training backend",
    ),
    "parallel_sizes_divide_cluster": (
        QWEN_FP8,
        "policy:\n  megatron_cfg:\n    tensor_model_parallel_size: 3\n",
        "policy.megatron_cfg.tensor_model_parallel_size: Megatron model-parallel group of 3 GPUs (tensor_model_parallel_size=3 x pipeline_model_parallel_size=1 x context_parallel_size=1) does not divide the cluster's 8 GPUs",
    ),
    "fp8_training_needs_megatron": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-1n8g-fp8-uncalibrated.yaml",
        "policy:\n  megatron_cfg:\n    enabled: false\n",
        "policy.megatron_cfg.fp8_cfg.enabled: FP8 training needs the Megatron backend",
    ),
    "calibration_needs_fp8_param_false": (
        QWEN_FP8,
        "policy:\n  megatron_cfg:\n    fp8_cfg:\n      fp8_param: true\n",
        "policy.megatron_cfg.fp8_cfg.fp8_param: calibration needs BF16 master weights for its shadow passes, but fp8_param keeps parameters in FP8. Fix: set fp8_param: false",
    ),
    "calibration_needs_several_updates": (
        QWEN_FP8,
        "policy:\n  train_global_batch_size: 512\n",
        "policy.train_global_batch_size: calibration on with 1 optimiser step per rollout batch: the ratio stays at 1, clipping is structurally inactive",
    ),
    "calibration_needs_fp8_training": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-1n8g-bf16.yaml",
        "loss_fn:\n  calibration:\n    enabled: true\n",
        "loss_fn.calibration.enabled: calibration on without FP8 training: BF16 and FP8 ratios coincide, so it is inert",
    ),
    "calibration_token_level": (
        QWEN_FP8,
        "loss_fn:\n  token_level_loss: false\n  sequence_level_importance_ratios: true\n",
        "loss_fn.sequence_level_importance_ratios: calibration works on token-level ratios only",
    ),
    "batch_sizes_divide": (
        TINY_BF16,
        "policy:\n  train_global_batch_size: 60\n  train_micro_batch_size: 60\n",
        "policy.train_global_batch_size: 256 samples per step (num_prompts_per_step x num_generations_per_prompt) do not split into batches of 60",
    ),
    "tis_needs_ratio": (
        TINY_BF16,
        "loss_fn:\n  truncated_importance_sampling_ratio: 0.0\n",
        "loss_fn.truncated_importance_sampling_ratio: tis needs a positive truncation ratio, got 0.0",
    ),
    "icepop_needs_min": (
        TINY_BF16,
        "loss_fn:\n  truncated_importance_sampling_type: icepop\n",
        "loss_fn.truncated_importance_sampling_ratio_min: icepop needs a lower bound",
    ),
    "dual_clip_above_one": (
        TINY_BF16,
        "loss_fn:\n  ratio_clip_c: 0.5\n",
        "loss_fn.ratio_clip_c: dual-clip constant 0.5 must be > 1",
    ),
    "tp4_equal_micro_batches": (
        ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16.yaml",
        "policy:\n  logprob_batch_size: 4\n",
        "policy.logprob_batch_size: with tensor_model_parallel_size >= 4, logprob_batch_size (4) must equal train_micro_batch_size (1)",
    ),
    "cpu_refuses_gpu_features": (
        TINY_FP8,
        "policy:\n  megatron_cfg:\n    fp8_cfg:\n      fp8_param: true\n",
        "policy.megatron_cfg.fp8_cfg.fp8_param: FP8 primary weights are a Transformer Engine GPU feature (and leave no BF16 reference) (cluster.gpus_per_node is 0: the embedded CPU engine). Fix: set policy.megatron_cfg.fp8_cfg.fp8_param=false",
    ),
    "four_bit_emulation": (
        TINY_FP8,
        "local:\n  fp4: nvfp4\n",
        "policy.megatron_cfg.fp8_cfg.enabled: local.fp4: nvfp4 replaces FP8 on both sides, but policy.megatron_cfg.fp8_cfg.enabled is True. Fix: set policy.megatron_cfg.fp8_cfg.enabled=false (configs/precision/nvfp4-cpu.yaml on a BF16 recipe does)",
    ),
    "cpu_refuses_model_parallelism": (
        TINY_BF16,
        "policy:\n  megatron_cfg:\n    tensor_model_parallel_size: 2\n",
        "policy.megatron_cfg.tensor_model_parallel_size: model parallelism needs several GPUs (cluster.gpus_per_node is 0: the embedded CPU engine). Fix: set policy.megatron_cfg.tensor_model_parallel_size=1",
    ),
    "cpu_one_node": (
        TINY_BF16,
        "cluster:\n  num_nodes: 2\n",
        "cluster.num_nodes: the embedded engine places one trainer and one rollout engine",
    ),
    "model_named": (
        TINY_BF16,
        "policy:\n  model_name: null\n",
        "policy.model_name: no model set",
    ),
    "megatron_checkpoint_format": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-1n8g-bf16.yaml",
        "checkpointing:\n  model_save_format: safetensors\n",
        "checkpointing.model_save_format: 'safetensors' is set, and NeMo RL refuses it",
    ),
    "quantize_on_trainer_needs_fp8_rollout": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-1n8g-bf16.yaml",
        "refit:\n  quantize_on: trainer\n",
        "policy.generation.vllm_cfg.precision: refit.quantize_on: trainer: BF16 rollout",
    ),
    "precision_split_fp8_training_bf16_generation": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-1n8g-fp8-uncalibrated.yaml",
        "policy:\n  generation:\n    vllm_cfg:\n      precision: bfloat16\n",
        "policy.generation.vllm_cfg.precision: FP8 training (policy.megatron_cfg.fp8_cfg.enabled: "
        "true) with BF16 generation: a train/rollout precision split",
    ),
    "precision_split_undeclared": (
        ROOT / "recipes/qwen3-4b/grpo-qwen3-4b-2n4g-fp8-mxfp8-rollout.yaml",
        "refit:\n  precision_split: false\n",
        "policy.megatron_cfg.fp8_cfg.enabled: FP8 generation (policy.generation.vllm_cfg.precision: "
        "fp8) with BF16 training",
    ),
    "engine_rules": (
        ROOT / "recipes/llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-fp8.yaml",
        "grpo:\n  use_dynamic_sampling: true\n",
        "grpo.use_dynamic_sampling: True is refused with grpo.async_grpo.enabled",
    ),
}


@pytest.mark.parametrize("case", RULE_CASES, ids=str)
def test_rule_has_failing_example(tmp_path, case):
    parent, body, expected = RULE_CASES[case]
    lines = bad(tmp_path, parent, body)
    assert any(expected in line for line in lines), "\n".join(lines)


def test_every_rule_is_exercised():
    from nemo_fp8_rl.config.rules import RULES

    covered = {
        "fp8_rollout_needs_is",
        "fp8_kv_cache_requirements",
        "fp8_training_needs_megatron",
        "megatron_checkpoint_format",
        "batch_sizes_divide",
        "calibration_requirements",
        "importance_sampling_settings",
        "tensor_parallel_batches",
        "cpu_supported_features",
        "model_named",
        "parallel_sizes_divide_cluster",
        "quantize_on_trainer",
        "four_bit_emulation",
        "precision_split",
        "engine_rules",
    }
    assert {rule.__name__ for rule in RULES} == covered
