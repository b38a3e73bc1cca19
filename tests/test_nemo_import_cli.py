"""`nemo_fp8_rl.recipes import` and `train --recipe` on a NeMo RL-shaped config (no NeMo RL here).

The config is written the way NeMo RL's own files are: a child with `defaults:` over a parent,
`${...}` interpolations, `${oc.env:...}`, hand-set `log_dir`/`checkpoint_dir`, DTensor keys the
project's base lacks, and none of the project's sections. tests/test_nemo_import.py runs the
import on every GRPO config of a real NeMo RL tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from nemo_fp8_rl.cli import recipes as recipes_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.recipe import _resolved_base

PROJECT_ONLY = ("local", "refit", "slurm")


def _nemo_shaped(folder: Path, dtensor: bool = True, dtensor_extra: dict | None = None) -> Path:
    """A parent/child pair shaped like NeMo RL's grpo_math_1B.yaml and a recipe over it."""
    parent = {k: v for k, v in _resolved_base().items() if k not in PROJECT_ONLY}
    parent = yaml.safe_load(yaml.safe_dump(parent))
    parent["loss_fn"].pop("calibration"), parent["loss_fn"].pop("ablation", None)
    parent["policy"]["model_name"] = "Qwen/Qwen2.5-1.5B"
    parent["logger"]["log_dir"] = "logs"
    parent["checkpointing"]["checkpoint_dir"] = "results/grpo"
    parent["policy"]["megatron_cfg"]["enabled"] = not dtensor
    parent["policy"]["dtensor_cfg"] = {
        "enabled": dtensor,
        "_v2": True,
        "tensor_parallel_size": 1,
        "context_parallel_size": 1,
        "lora_cfg": {"enabled": False, "dim": 8},
        **(dtensor_extra or {}),
    }
    parent["data"]["default"]["prompt_file"] = "${oc.env:NEMO_IMPORT_TEST_DIR,/tmp/data}"
    (folder / "grpo_base.yaml").write_text(yaml.safe_dump(parent))
    child = folder / "recipes" / "grpo-child.yaml"
    child.parent.mkdir()
    child.write_text(
        "defaults: ../grpo_base.yaml\n"
        "grpo:\n  num_prompts_per_step: 8\n"
        "policy:\n  train_global_batch_size: ${mul:${grpo.num_prompts_per_step}, 2}\n"
    )
    return child


def test_import_keeps_nemo_keys_and_fills_project_sections(tmp_path, capsys):
    src = _nemo_shaped(tmp_path)
    out = tmp_path / "mine.yaml"
    assert recipes_cli.main(["import", str(src), str(out)]) == 0
    assert "train it with" in capsys.readouterr().out
    recipe = load_recipe(out)
    cfg = recipe.config
    assert cfg["policy"]["dtensor_cfg"]["_v2"] is True
    assert cfg["policy"]["dtensor_cfg"]["lora_cfg"] == {"enabled": False, "dim": 8}
    assert cfg["policy"]["train_global_batch_size"] == 16
    assert cfg["data"]["default"]["prompt_file"] == "/tmp/data"
    assert all(k in cfg for k in PROJECT_ONLY) and "calibration" in cfg["loss_fn"]
    assert cfg["checkpointing"]["checkpoint_dir"] == str(Path.cwd() / "results" / "grpo")
    assert cfg["logger"]["log_dir"] == str(Path.cwd() / "logs")
    assert "checkpointing.checkpoint_dir are NeMo RL's, kept" in out.read_text()


def test_train_dry_run_takes_a_nemo_config(tmp_path, capsys):
    src = _nemo_shaped(tmp_path)
    # Without NeMo RL the dry run prints the imported recipe, then exits 3 (no engine), as train.
    code = invoke(train_cli.main, ["--recipe", str(src), "--dry-run"])
    captured = capsys.readouterr()
    assert "is a NeMo RL config: imported as a recipe" in captured.err
    assert "_v2: true" in captured.out and "refit:" in captured.out
    assert code == (0 if importlib.util.find_spec("nemo_rl") else 3)


def test_unknown_key_is_still_refused_with_its_file(tmp_path, capsys):
    src = _nemo_shaped(tmp_path, dtensor_extra={"tensor_paralel_size": 2})
    out = tmp_path / "mine.yaml"
    assert invoke(recipes_cli.main, ["import", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "policy.dtensor_cfg.tensor_paralel_size: unknown key" in err
    assert "did you mean policy.dtensor_cfg.tensor_parallel_size" in err
    assert str(tmp_path / "grpo_base.yaml") in err and not out.exists()


def test_fp8_on_dtensor_is_refused_where_dtensor_is_set(tmp_path, capsys):
    src = _nemo_shaped(tmp_path)
    out = tmp_path / "mine.yaml"
    assert invoke(recipes_cli.main, ["import", str(src), str(out), "--fp8"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'grpo_base.yaml'}: policy.dtensor_cfg.enabled: is True" in err
    assert "Fix: import a Megatron config" in err and not out.exists()
    assert invoke(recipes_cli.main, ["import", str(src), str(out), "--calibrated"]) == 2
    assert "calibrated clipping runs in the Megatron policy" in capsys.readouterr().err


def test_fp8_on_megatron_adds_overlay_and_is_correction(tmp_path, capsys):
    src = _nemo_shaped(tmp_path, dtensor=False)
    out = tmp_path / "fp8.yaml"
    assert recipes_cli.main(["import", str(src), str(out), "--fp8", "tensorwise"]) == 0
    cfg = load_recipe(out).config
    assert cfg["policy"]["megatron_cfg"]["fp8_cfg"]["fp8_recipe"] == "tensorwise"
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert cfg["loss_fn"]["use_importance_sampling_correction"] is True
    assert "configs/precision/fp8-tensorwise.yaml" in out.read_text()


def test_unset_environment_variable_is_located(tmp_path, capsys, monkeypatch):
    src = _nemo_shaped(tmp_path)
    base = tmp_path / "grpo_base.yaml"
    base.write_text(
        base.read_text().replace(
            "${oc.env:NEMO_IMPORT_TEST_DIR,/tmp/data}", "${oc.env:NEMO_IMPORT_TEST_DIR}"
        )
    )
    monkeypatch.delenv("NEMO_IMPORT_TEST_DIR", raising=False)
    assert invoke(recipes_cli.main, ["import", str(src), str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        f"{base}: data.default.prompt_file: needs the environment variable NEMO_IMPORT_TEST_DIR"
        in err
    )
    monkeypatch.setenv("NEMO_IMPORT_TEST_DIR", "/data/here")
    assert recipes_cli.main(["import", str(src), str(tmp_path / "x.yaml")]) == 0
    assert load_recipe(tmp_path / "x.yaml").config["data"]["default"]["prompt_file"] == "/data/here"


@pytest.mark.parametrize(
    "content, expected",
    [
        ("policy:\n  model_name: x\n", "grpo: not a GRPO config"),
        (None, "no such file"),
    ],
)
def test_not_a_grpo_config_or_no_file(tmp_path, capsys, content, expected):
    src = tmp_path / "sft.yaml"
    if content is not None:
        src.write_text(content)
    assert invoke(recipes_cli.main, ["import", str(src)]) == 2
    assert expected in capsys.readouterr().err


def test_existing_file_needs_overwrite(tmp_path, capsys):
    src = _nemo_shaped(tmp_path)
    out = tmp_path / "mine.yaml"
    out.write_text("keep: me\n")
    assert invoke(recipes_cli.main, ["import", str(src), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "keep: me\n"
    assert recipes_cli.main(["import", str(src), str(out), "--overwrite"]) == 0


def test_train_seeds_takes_a_nemo_config(tmp_path, capsys):
    src = _nemo_shaped(tmp_path, dtensor=False)
    code = invoke(train_cli.main, ["--recipe", str(src), "--seeds", "1-2", "--dry-run"])
    captured = capsys.readouterr()
    err = captured.err
    assert "is a NeMo RL config: imported as a recipe" in err
    from nemo_fp8_rl.engines import nemo

    if nemo.available()[0]:  # the contract environment: NeMo RL can take it
        assert code == 0
        out = captured.out
        assert f"checkpointing.checkpoint_dir={Path.cwd() / 'results' / 'grpo' / 'seed-2'}" in out
    else:
        assert code == 3 and "needs the NeMo RL engine" in err  # a GPU config, no NeMo RL here


def test_data_plane_is_written_off_with_the_reason(tmp_path):
    """NeMo RL's TransferQueue configs (data_plane.enabled: true) import with the data plane
    off, as the engine runs NeMo RL's legacy data path, and the recipe's header says so."""
    src = _nemo_shaped(tmp_path)
    base = tmp_path / "grpo_base.yaml"
    data = yaml.safe_load(base.read_text())
    data["data_plane"]["enabled"] = True
    base.write_text(yaml.safe_dump(data))
    out = tmp_path / "mine.yaml"
    assert recipes_cli.main(["import", str(src), str(out)]) == 0
    assert load_recipe(out).config["data_plane"]["enabled"] is False
    assert "NeMo RL's data_plane.enabled: True is written False (the NeMo RL engine" in (
        out.read_text()
    )
