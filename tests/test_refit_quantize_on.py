"""`refit.quantize_on`: the overlay loads on the FP8 recipes; `trainer` is refused, with the key
and the file that set it, wherever the trainer-side FP8 refit path does not exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.config import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[1]
OVERLAY = ROOT / "configs" / "refit" / "quantize-on-trainer.yaml"
FP8 = ROOT / "recipes" / "qwen3-8b-base" / "grpo-qwen3-8b-base-1n8g-fp8.yaml"
BF16 = ROOT / "recipes" / "qwen3-8b-base" / "grpo-qwen3-8b-base-1n8g-bf16.yaml"


def with_overlay(tmp_path: Path, recipe: Path) -> Path:
    path = tmp_path / f"{recipe.stem}-trainer.yaml"
    path.write_text(f"defaults:\n  - {recipe}\n  - {OVERLAY}\n")
    return path


def test_default_is_generator_and_the_overlay_switches_it(tmp_path: Path) -> None:
    assert load_recipe(FP8).config["refit"]["quantize_on"] == "generator"
    assert load_recipe(with_overlay(tmp_path, FP8)).config["refit"]["quantize_on"] == "trainer"


def test_bf16_rollout_is_refused_with_the_key_and_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(with_overlay(tmp_path, BF16))
    (issue,) = err.value.issues
    assert issue.key == "policy.generation.vllm_cfg.precision"
    assert "nothing to quantize" in issue.what and "quantize_on: generator" in issue.fix
    assert issue.file.endswith("grpo.yaml")


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        (
            "policy.generation.refit_transport=nccl_reshard",
            "policy.generation.refit_transport",
            "factory.py:130",
        ),
        (
            "policy.megatron_cfg.fp8_cfg.fp8_param=true",
            "policy.megatron_cfg.fp8_cfg.fp8_param",
            "_is_fp8_export",
        ),
        (
            "policy.megatron_cfg.mtp_num_layers=1",
            "policy.megatron_cfg.mtp_num_layers",
            "MTP drafter",
        ),
        ("policy.generation.backend=megatron", "policy.generation.backend", "vLLM worker"),
    ],
)
def test_unsupported_combinations_are_refused(
    tmp_path: Path, override: str, key: str, says: str
) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(with_overlay(tmp_path, FP8), [override])
    issues = [i for i in err.value.issues if "quantize_on: trainer" in i.what]
    assert [i.key for i in issues] == [key]
    assert says in issues[0].what and issues[0].file == "override"


def test_generator_accepts_what_trainer_refuses() -> None:
    load_recipe(FP8, ["policy.generation.refit_transport=nccl_reshard"])


def test_trainer_accepts_mxfp8() -> None:
    """is_mx pairs (E4M3 + E8M0 `_scale_from_checkpoint`) are made on the trainer too; a NeMo RL
    that does not read is_mx is refused when the run starts (engines.nemo.mx_support)."""
    recipe = load_recipe("qwen3-4b/grpo-qwen3-4b-2n4g-fp8-mxfp8", ["refit.quantize_on=trainer"])
    assert recipe.config["policy"]["generation"]["vllm_cfg"]["is_mx"]


def test_trainer_runs_with_the_async_engine(tmp_path: Path) -> None:
    """The async engine's worker has a trainer-side twin (`TrainerFp8VllmAsyncGenerationWorker`)."""
    load_recipe(with_overlay(tmp_path, FP8), ["policy.generation.vllm_cfg.async_engine=true"])
