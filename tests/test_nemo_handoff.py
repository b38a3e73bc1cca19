"""The config hand-off for every recipe, the run-dir files, and what stops the engine early."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from nemo_fp8_rl.config import RecipeError, find_recipes, load_recipe, short_name
from nemo_fp8_rl.config.schema import PROJECT_SECTIONS
from nemo_fp8_rl.engines.nemo import to_nemo_config
from nemo_fp8_rl.engines.nemo.driver import runner
from nemo_fp8_rl.engines.nemo.driver.handoff import HANDOFF_FILE, write_handoff

RECIPES = find_recipes()
# The project's own sections (config.schema.PROJECT_SECTIONS): top-level ones and loss_fn's.
PROJECT_KEYS = tuple(k for k in PROJECT_SECTIONS if "." not in k)
LOSS_KEYS = tuple(k.split(".", 1)[1] for k in PROJECT_SECTIONS if k.startswith("loss_fn."))


def _strip(config: dict) -> dict:
    out = copy.deepcopy(config)
    for key in PROJECT_KEYS:
        out.pop(key, None)
    for key in LOSS_KEYS:
        out["loss_fn"].pop(key, None)
    return out


@pytest.mark.parametrize("path", RECIPES, ids=[short_name(p) for p in RECIPES])
def test_handoff_is_the_recipe_minus_project_sections(path, tmp_path) -> None:
    recipe = load_recipe(path, run_dir=tmp_path / "run")
    before = copy.deepcopy(recipe.config)
    cfg = to_nemo_config(recipe)
    assert recipe.config == before  # the recipe is not modified
    assert not set(PROJECT_KEYS) & set(cfg) and "calibration" not in cfg["loss_fn"]
    assert cfg == _strip(recipe.config)
    assert cfg["logger"]["log_dir"] == str(tmp_path / "run" / "logs")
    assert cfg["checkpointing"]["checkpoint_dir"] == str(tmp_path / "run" / "checkpoints")
    written = write_handoff(recipe, tmp_path / "run")
    assert written.name == HANDOFF_FILE
    assert yaml.safe_load(written.read_text()) == cfg


def test_gpu_recipes_pass_the_engine_checks() -> None:
    gpu = [p for p in RECIPES if load_recipe(p).config["cluster"]["gpus_per_node"] > 0]
    assert gpu, "expected GPU recipes under recipes/"
    for path in gpu:
        problems = [p for p in runner.check_recipe(load_recipe(path)) if not _dropped_kv(p)]
        assert problems == [], short_name(path)


def _dropped_kv(problem) -> bool:
    """The kv-scales-refit refusal, where this NeMo RL tree's colocated refit drops the FP8
    KV scales (v0.7.0, NeMo RL PR #3226): the recipe is refused there by design."""
    import os
    from pathlib import Path

    from nemo_fp8_rl.guards.field_checks import tree_drops_kv_scales

    src = Path(os.environ.get("NEMO_RL_SRC", "."))
    return "kv-scales-refit" in str(problem) and tree_drops_kv_scales(src)


def test_cpu_recipe_and_unsupported_options_are_reported_together() -> None:
    loaded = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", ["refit.bridge=project"])
    cfg = copy.deepcopy(loaded.config)  # async GRPO on a CPU recipe is refused at load already
    cfg["grpo"]["async_grpo"]["enabled"] = True
    recipe = dataclasses.replace(loaded, config=cfg)
    problems = runner.check_recipe(recipe)
    assert any("--engine local" in p for p in problems)
    assert any("refit.bridge: project" in p for p in problems)
    assert any("async_grpo" in p for p in problems)
    with pytest.raises(runner.EngineConfigError, match="cannot run on the NeMo RL engine"):
        runner.run(recipe)


def test_calibration_needs_the_megatron_policy() -> None:
    base = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    cfg = copy.deepcopy(base.config)
    cfg["policy"]["megatron_cfg"]["enabled"] = False
    problems = runner.check_recipe(dataclasses.replace(base, config=cfg))
    assert any("needs the Megatron policy" in p for p in problems)
    cfg["policy"]["megatron_cfg"].update(enabled=True, cuda_graph_impl="local")
    problems = runner.check_recipe(dataclasses.replace(base, config=cfg))
    assert problems == [p for p in problems if "cuda_graph_impl: local" in p] and problems


def test_run_dir_resume_rules(tmp_path) -> None:
    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", run_dir=tmp_path / "r")
    with pytest.raises(runner.EngineConfigError, match="--resume given"):
        runner.prepare_run_dir(recipe, resume=True)
    run_dir = runner.prepare_run_dir(recipe, resume=False)
    assert (run_dir / "recipe.yaml").is_file() and (run_dir / HANDOFF_FILE).is_file()
    (tmp_path / "r" / "checkpoints" / "step_10").mkdir(parents=True)
    with pytest.raises(runner.EngineConfigError, match="pass --resume"):
        runner.prepare_run_dir(recipe, resume=False)
    assert runner.prepare_run_dir(recipe, resume=True) == run_dir
    assert runner.prepare_run_dir(recipe, resume=False, overwrite=True) == run_dir
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_hand_set_output_paths_are_used_and_never_removed(tmp_path) -> None:
    """A NeMo RL config's own checkpoint_dir / log_dir: the run writes there; --overwrite
    refuses to delete checkpoints in it and leaves the (shared) log folder alone."""
    ckpt, logs = tmp_path / "results" / "grpo", tmp_path / "logs"
    recipe = load_recipe(
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
        [f"checkpointing.checkpoint_dir={ckpt}", f"logger.log_dir={logs}"],
        run_dir=tmp_path / "r",
    )
    run_dir = runner.prepare_run_dir(recipe, resume=False)
    handed = (run_dir / HANDOFF_FILE).read_text()
    assert f"checkpoint_dir: {ckpt}" in handed and f"log_dir: {logs}" in handed
    (ckpt / "step_3").mkdir(parents=True)
    (logs / "exp_001").mkdir(parents=True)
    with pytest.raises(RecipeError, match="never a folder set by hand"):
        runner.prepare_run_dir(recipe, resume=False, overwrite=True)
    assert (ckpt / "step_3").is_dir() and (logs / "exp_001").is_dir()
    assert runner.prepare_run_dir(recipe, resume=True) == run_dir


def test_overwrite_never_removes_a_hand_set_folder_of_user_files(tmp_path) -> None:
    """A hand-set checkpoint_dir holding no step_* folder but the user's files: --overwrite
    used to remove it whole (`_clear_outputs` -> rmtree); it is refused and left as it was."""
    mine = tmp_path / "mine"
    (mine / "thesis").mkdir(parents=True)
    (mine / "thesis" / "chapter1.tex").write_text("results\n")
    recipe = load_recipe(
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
        [f"checkpointing.checkpoint_dir={mine}"],
        run_dir=tmp_path / "r",
    )
    with pytest.raises(RecipeError, match="holds files NeMo RL does not write there"):
        runner.prepare_run_dir(recipe, resume=False, overwrite=True)
    assert (mine / "thesis" / "chapter1.tex").read_text() == "results\n"


def test_build_loss_restores_the_calibrator_from_the_resume_checkpoint(tmp_path) -> None:
    from nemo_fp8_rl.engines.nemo.driver.checkpoint import save_calibrator_state

    recipe = load_recipe(
        "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
        [
            "loss_fn.calibration.init_bounds=[0.7,1.3]",
            "policy.megatron_cfg.use_fused_linear_logprobs=true",
        ],
    )
    saved = runner.build_loss(recipe, None)
    assert saved.calibrator.bounds == (0.7, 1.3) and saved.use_fused_linear_logprobs
    rollout = (
        recipe.config["grpo"]["num_prompts_per_step"]
        * recipe.config["grpo"]["num_generations_per_prompt"]
    )
    assert (
        saved.calibrator.updates_per_step
        == rollout // recipe.config["policy"]["train_global_batch_size"]
    )
    state = saved.calibrator.state_dict()
    saved.calibrator.load_state_dict({**state, "bounds": [0.65, 1.35]})  # as after calibrating
    save_calibrator_state(saved.calibrator, tmp_path / "step_20")
    fresh = runner.build_loss(recipe, str(tmp_path / "step_20"))
    assert fresh.calibrator.bounds == (0.65, 1.35)
    uncalibrated = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8-uncalibrated")
    assert runner.build_loss(uncalibrated, str(tmp_path / "step_20")).calibrator is None


def test_run_dir_of_another_recipe_is_refused(tmp_path) -> None:
    fp8 = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", run_dir=tmp_path / "r")
    runner.prepare_run_dir(fp8, resume=False)
    bf16 = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-bf16", run_dir=tmp_path / "r")
    with pytest.raises(
        runner.EngineConfigError, match="holds a run of recipe 'grpo-qwen3-8b-base-1n8g-fp8'"
    ):
        runner.prepare_run_dir(bf16, resume=False)
    saved = yaml.safe_load((tmp_path / "r" / "recipe.yaml").read_text())
    assert saved["policy"]["megatron_cfg"]["fp8_cfg"]["enabled"] is True  # not overwritten
