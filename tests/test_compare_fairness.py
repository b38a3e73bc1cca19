"""`compare` gives a precision verdict only between runs that differ in precision and seed: each
field of `environment.json` it checks (engine, generator, NeMo RL version and tree) and recipe
keys outside the precision groups refuse with one located line naming the difference, or with
`--allow-unfair` label the verdict (`analysis.fairness`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_compare import write_project_run

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.compare import main

REAL_VLLM = {
    "backend": "vllm",
    "version": "0.25.1",
    "build": "cpu",
    "reason": "NeMo RL's vLLM worker",
}
STAND_IN = {"backend": "stand-in", "version": None, "build": "cpu", "reason": "no AMX"}
MAIN_TREE = {"commit": "7ea279abfbeb698b092856d0dab61e7cf39bc909", "source_sha256": "a" * 64}
V070_TREE = {"commit": "81aa43dda4765b0429cf31dab44441e4e4383911", "source_sha256": "b" * 64}
BASE = {"engine": "nemo", "generator": REAL_VLLM, "nemo_rl": "0.7.0", "nemo_rl_tree": MAIN_TREE}


def _pair(tmp_path: Path, fp8_env: dict, **recipe: object) -> tuple[Path, Path]:
    bf16 = write_project_run(tmp_path / "bf16", 20, precision="bf16", acc_final=0.6, step_s=2.0)
    fp8 = write_project_run(tmp_path / "fp8", 20, precision="fp8", acc_final=0.55, step_s=2.0)
    (bf16 / "environment.json").write_text(json.dumps(BASE))
    (fp8 / "environment.json").write_text(json.dumps({**BASE, **fp8_env}))
    if recipe:
        config = yaml.safe_load((fp8 / "recipe.yaml").read_text())
        for dotted, value in recipe.items():
            section, key = dotted.split("__")
            config.setdefault(section, {})[key] = value
        (fp8 / "recipe.yaml").write_text(yaml.safe_dump(config))
    return bf16, fp8


@pytest.mark.parametrize(
    ("env", "recipe", "named"),
    [
        ({"engine": "local"}, {}, "engine local here, nemo in"),
        (
            {"generator": STAND_IN},
            {},
            "generator stand-in (cpu build) here, vllm 0.25.1 (cpu build) in",
        ),
        (
            {"generator": {**REAL_VLLM, "version": "0.20.0"}},
            {},
            "generator vllm 0.20.0 (cpu build) here",
        ),
        ({"nemo_rl": "0.6.0"}, {}, "NeMo RL version 0.6.0 here, 0.7.0 in"),
        (
            {"nemo_rl_tree": V070_TREE},
            {},
            "NeMo RL tree commit 81aa43dda476 here, commit 7ea279abfbeb in",
        ),
        (
            {"nemo_rl_tree": {"commit": None, "source_sha256": "c" * 64}},
            {},
            "NeMo RL tree source sha256 cccccccccccc here",
        ),
        (
            {},
            {"grpo__num_prompts_per_step": 64},
            "recipe key grpo.num_prompts_per_step 64 here, absent in",
        ),
    ],
)
def test_a_difference_beyond_precision_and_seed_is_refused_naming_it(
    tmp_path, capsys, env, recipe, named
):
    bf16, fp8 = _pair(tmp_path, env, **recipe)
    out = tmp_path / "report"
    assert invoke(main, [str(bf16), str(fp8), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    where = "recipe.yaml" if recipe else "environment.json"
    assert err[0].startswith(
        f"error: {fp8 / where}: fp8 differs from bf16 in more than precision and seed"
    )
    assert named in err[0] and "Fix: " in err[0] and "--allow-unfair" in err[0]
    assert not out.exists()  # refused before anything was written


def test_allow_unfair_labels_the_verdict_in_terminal_report_and_json(tmp_path, capsys):
    bf16, fp8 = _pair(tmp_path, {"generator": STAND_IN, "nemo_rl_tree": V070_TREE})
    out = tmp_path / "report"
    assert (
        invoke(main, [str(bf16), str(fp8), "--out", str(out), "--no-plots", "--allow-unfair"]) == 0
    )
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    label = "NOT A PRECISION COMPARISON (differs from bf16 in generator stand-in (cpu build) here"
    assert label in printed and "NeMo RL tree commit 81aa43dda476 here" in printed
    assert label in (out / "report.md").read_text()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["fair"] is False and verdict["verdicts"][0]["text"].startswith("NOT A PRECISION")


def test_seed_alone_differs_and_the_verdict_is_given(tmp_path, capsys):
    bf16, fp8 = _pair(tmp_path, {}, grpo__seed=7)
    out = tmp_path / "report"
    assert invoke(main, [str(bf16), str(fp8), "--out", str(out), "--no-plots"]) == 0
    assert "NOT A PRECISION" not in capsys.readouterr().out
    assert json.loads((out / "verdict.json").read_text())["fair"] is True


def test_a_field_only_one_run_recorded_is_said_unchecked(tmp_path, capsys):
    bf16, fp8 = _pair(tmp_path, {})
    (bf16 / "environment.json").write_text(json.dumps({"engine": "nemo"}))  # an older run
    assert invoke(main, [str(bf16), str(fp8), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert (
        "(not checked: generator, NeMo RL version, NeMo RL tree, recorded by only one of fp8 and bf16)"
        in printed
    )
