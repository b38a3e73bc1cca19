"""The first hour at the command line: calibration on an imported NeMo RL config, commands that
run where they are pasted, completion after `uv run`, one problem per unset `${oc.env:VAR}`, the
overrides' `+` and `++` as documented, and the smaller things a new user meets (`recipes --help`,
`refit --help`, a study report kept out of docs/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_nemo_import_cli import _nemo_shaped

from nemo_fp8_rl.cli import recipes as recipes_cli
from nemo_fp8_rl.cli import refit as refit_cli
from nemo_fp8_rl.cli import study as study_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
T = "tiny/grpo-tiny-qwen3-cpu-fp8"


# ---- calibration on an imported NeMo RL config -------------------------------------------------


def _one_step_megatron_config(folder: Path) -> tuple[Path, int]:
    """A NeMo RL-shaped Megatron config with one optimiser step per rollout batch (NeMo RL's
    usual `train_global_batch_size` = prompts x generations); returns it and that batch."""
    child = _nemo_shaped(folder, dtensor=False)
    text = child.read_text().replace(
        "${mul:${grpo.num_prompts_per_step}, 2}",
        "${mul:${grpo.num_prompts_per_step}, ${grpo.num_generations_per_prompt}}",
    )
    child.write_text(text)
    base = yaml.safe_load((folder / "grpo_base.yaml").read_text())
    return child, 8 * base["grpo"]["num_generations_per_prompt"]


def test_calibrated_import_names_the_batch_size_that_gives_several_steps(tmp_path, capsys):
    src, samples = _one_step_megatron_config(tmp_path)
    out = tmp_path / "mine.yaml"
    assert invoke(recipes_cli.main, ["import", str(src), str(out), "--fp8", "--calibrated"]) == 2
    err = capsys.readouterr().err
    proposed = samples // 4
    assert f"Fix: set policy.train_global_batch_size={proposed} (an override" in err
    assert f"4 optimiser steps per rollout batch of {samples} samples" in err and not out.exists()
    argv = ["import", str(src), str(out), "--fp8", "--calibrated",
            f"policy.train_global_batch_size={proposed}"]  # fmt: skip
    assert invoke(recipes_cli.main, argv) == 0, capsys.readouterr().err
    config = load_recipe(out).config
    assert config["policy"]["train_global_batch_size"] == proposed
    assert config["loss_fn"]["calibration"]["enabled"] is True
    assert "# Set on the import command: policy.train_global_batch_size" in out.read_text()


def test_import_takes_an_override_without_a_file_name(tmp_path, monkeypatch, capsys):
    src, _ = _one_step_megatron_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert invoke(recipes_cli.main, ["import", str(src), "grpo.max_num_steps=7"]) == 0
    written = tmp_path / f"{src.stem}.yaml"
    assert load_recipe(written).config["grpo"]["max_num_steps"] == 7


def test_unset_environment_variable_is_one_problem(tmp_path, monkeypatch, capsys):
    src = _nemo_shaped(tmp_path)
    base = tmp_path / "grpo_base.yaml"
    base.write_text(base.read_text().replace("${oc.env:NEMO_IMPORT_TEST_DIR,/tmp/data}",
                                             "${oc.env:NEMO_IMPORT_TEST_DIR}"))  # fmt: skip
    monkeypatch.delenv("NEMO_IMPORT_TEST_DIR", raising=False)
    assert invoke(recipes_cli.main, ["import", str(src), str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert "has 1 problem(s)" in err and "unknown resolver" not in err


# ---- commands that run where they are pasted ---------------------------------------------------


def test_printed_commands_follow_how_the_command_was_started(tmp_path, monkeypatch):
    from nemo_fp8_rl.config.commands import command, project_root

    venv_python = project_root() / ".venv" / "bin" / "python"
    monkeypatch.setattr(sys, "prefix", str(venv_python.parents[1]))
    monkeypatch.setenv("UV", "/usr/bin/uv")
    monkeypatch.chdir(project_root())
    assert command("train") == "uv run nemo_fp8_rl.train"
    monkeypatch.chdir(tmp_path)  # another folder: a bare `uv run` would fail to spawn
    assert command("eval") == f"uv run --project {project_root()} nemo_fp8_rl.eval"
    monkeypatch.delenv("UV")
    monkeypatch.setenv("PATH", str(tmp_path))  # no console script: NeMo RL's environment
    assert command("eval") == "python -m nemo_fp8_rl.eval"


def test_the_end_of_a_run_and_a_copy_print_commands_that_run(tmp_path, monkeypatch, capsys):
    from nemo_fp8_rl.config.commands import command
    from nemo_fp8_rl.runs.summary import next_lines

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "r"
    (run / "logs" / "tb").mkdir(parents=True)
    lines = "\n".join(next_lines(Path("runs/r")))
    assert f"  {command('eval')} --run runs/r " in lines
    assert "tensorboard --logdir runs/r/logs/tb" in lines
    assert invoke(recipes_cli.main, ["cp", T, "mine.yaml"]) == 0
    assert f"  {command('train')} --recipe mine.yaml" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_completion_after_uv_run_and_only_flags_a_command_takes(tmp_path):
    from nemo_fp8_rl.cli import completion

    script = tmp_path / "c.bash"
    script.write_text(completion.bash_script())

    def offered(*words: str) -> list[str]:
        array = " ".join(f"'{w}'" for w in words)
        program = (f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
                   'cd /nonexistent 2>/dev/null; _nemo_fp8_rl_uv; printf "%s\\n" "${COMPREPLY[@]}"')  # fmt: skip
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
        return [x for x in done.stdout.splitlines() if x]

    assert T in offered("uv", "run", "nemo_fp8_rl.train", "--recipe", "tiny/grpo-tiny-qwen3-cpu-f")
    assert offered("uv", "run", "--project", "/x", "nemo_fp8_rl.eval", "--ch") == ["--checkpoint"]
    assert offered("uv", "run", "python", "-m", "nemo_fp8_rl", "train", "--se") == ["--seeds"]
    assert offered("uv", "run", "nemo_fp8_rl.eval", "--pre") == []  # eval has no --preflight
    assert "--preflight" not in completion.command_flags("eval")
    assert "--json" in completion.command_flags("recipes")  # a subcommand's flag
    assert "--scheme" in completion.command_flags("refit")


# ---- overrides: + and ++ as NeMo RL users write them -------------------------------------------


def test_train_help_documents_plus_and_what_differs_from_nemo_rl(capsys):
    assert invoke(train_cli.main, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "+dotted.key=value adds one the recipe does not have" in text
    assert "++dotted.key=value adds or sets" in text
    assert "What differs from NeMo RL: the schema, not the prefix, decides which keys exist" in text


def test_plus_adds_a_key_nemo_rl_declares_and_refuses_one_it_does_not(capsys):
    cfg = load_recipe(T, ["+policy.dtensor_cfg.sequence_parallel=true"]).config
    assert cfg["policy"]["dtensor_cfg"]["sequence_parallel"] is True
    cfg = load_recipe(T, ["+policy.megatron_cfg.env_vars.MY_FLAG=1"]).config
    assert cfg["policy"]["megatron_cfg"]["env_vars"]["MY_FLAG"] == 1
    assert invoke(train_cli.main, ["--recipe", T, "+policy.foo=1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "policy.foo: unknown key" in err
    assert "NeMo RL's +key would add it and ignore it" in err


# ---- smaller things ----------------------------------------------------------------------------


def test_recipes_and_refit_help_list_every_subcommand_and_flag(capsys):
    assert invoke(recipes_cli.main, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "\n  import NEMO.yaml [FILE.yaml]" in out.split("positional arguments:")[0]
    assert invoke(refit_cli.main, ["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--scheme", "--pow2", "--first-bf16", "--shard-size-mb", "--version"):
        assert flag in out, flag


def test_study_keeps_its_report_out_of_docs(tmp_path, capsys):
    argv = ["--analyse-only", "--out", str(ROOT / "docs/study/runs")]
    before = sorted(p.name for p in (ROOT / "docs/study/runs").iterdir())
    assert invoke(study_cli.main, argv) == 2
    assert "inside the committed docs/" in capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "docs/study/runs").iterdir()) == before
    report = tmp_path / "report"
    assert invoke(study_cli.main, [*argv, "--report", str(report)]) == 0
    assert (report / "tables.md").is_file()


@pytest.mark.skipif(os.name != "posix", reason="console scripts on POSIX")
def test_recipes_validate_is_the_dry_check_that_exits_0(capsys):
    assert invoke(recipes_cli.main, ["validate", "qwen3-4b/grpo-qwen3-4b-1n8g-fp8"]) == 0
