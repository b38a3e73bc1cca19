"""One parser decision per ambiguity: a command line that could mean two things, or that asks
for something that would do nothing, is refused with a located error before anything runs.

Cases: an override prefix Hydra does not have (`+++key`), two recipe sources (`--config A
--recipe B`), a seed group into a folder of user files or into `/`, `--resume` with no seed run
to resume, and an FP8 export whose options leave no FP8 weight.
"""

from __future__ import annotations

import json

import pytest
from test_catalogue import hf_source  # noqa: F401 (the session fixture)

from nemo_fp8_rl.cli import refit as refit_cli
from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke

TINY = "tiny/grpo-tiny-qwen3-cpu-fp8"
GPU = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"


def refused(main, argv, capsys, *says: str, code: int = 2) -> str:
    got = invoke(main, argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert err.count("error: ") == 1 and "Fix:" in err and "Traceback" not in err, err
    for text in says:
        assert text in err, err
    return err


@pytest.mark.parametrize("prefix", ["+++", "++++"])
def test_an_override_prefix_hydra_does_not_have_is_refused(prefix, tmp_path, capsys):
    argv = ["--recipe", TINY, "--run-dir", str(tmp_path / "r"), "--dry-run",
            f"{prefix}grpo.max_num_steps=3"]  # fmt: skip
    refused(train_cli.main, argv, capsys, f"'{prefix}' is not an override prefix")


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", TINY, "--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16"],
        ["--recipe", TINY, "--config", TINY],
    ],
)
def test_two_recipe_sources_are_refused(argv, tmp_path, capsys):
    refused(train_cli.main, [*argv, "--dry-run"], capsys, "already given")


def test_seeds_into_a_folder_of_user_files_are_refused_and_the_files_kept(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    argv = ["--recipe", TINY, "--seeds", "1-2", "--run-dir", str(folder), "--dry-run"]
    refused(train_cli.main, argv, capsys, "thesis.tex", "not a seed group")
    assert [p.name for p in folder.iterdir()] == ["thesis.tex"]


def test_a_seed_array_into_the_root_folder_is_refused(capsys):
    argv = ["--recipe", GPU, "--seeds", "1-2", "--run-dir", "/", "--account", "a",
            "--partition", "p", "--dry-run"]  # fmt: skip
    refused(submit_cli.main, argv, capsys, "root or home folder")


def test_resume_with_no_seed_run_to_resume_is_refused(tmp_path, capsys):
    argv = ["--recipe", TINY, "--seeds", "1-2", "--run-dir", str(tmp_path / "g"), "--resume",
            "--dry-run"]  # fmt: skip
    refused(train_cli.main, argv, capsys, "--resume", "nothing to resume")
    assert not (tmp_path / "g").exists()


def test_an_fp8_export_that_keeps_every_layer_bf16_is_refused(tmp_path, hf_source, capsys):  # noqa: F811
    from catalogue_cases import Workspace

    src = Workspace(tmp_path, hf_source).hf("src")
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    out = tmp_path / "out"
    argv = ["export", str(src), str(out), "--first-bf16", str(layers + 997)]
    refused(refit_cli.main, argv, capsys, "no FP8 weight", "--first-bf16")
    assert not out.exists()


def test_submit_takes_a_nemo_rl_config_as_train_does(tmp_path, capsys):
    from test_nemo_import_cli import _nemo_shaped

    src = _nemo_shaped(tmp_path)
    argv = ["--config", str(src), "--account", "a", "--partition", "p", "--dry-run",
            "--run-dir", str(tmp_path / "run")]  # fmt: skip
    code = invoke(submit_cli.main, argv)
    err = capsys.readouterr().err
    assert "is a NeMo RL config: imported as a recipe" in err, err
    assert "refit: missing" not in err and "Traceback" not in err
    assert code == 0, err  # the dry run renders the job script
