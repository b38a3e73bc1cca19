"""The commands' own words (`catalogue_cli_cases.CASES`), their `--help`, `--version`, exit codes
and closed pipes; recipes copied with `recipes cp`, `defaults:` by short name, `~key` deletion;
the machine-readable `recipes list --json` and `compare --json` / `verdict.json`.

Every failing case must print `error: <where>: <what>. Fix: <how>` on stderr (a recipe's
problems as `  - <file>: <key>: <what>. Fix: <how>` lines under it), with no traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from catalogue_cases import Case
from catalogue_cli_cases import CASES, F, Q, T
from test_catalogue import ERROR_LINE, check_case_output, prepare_case, tree_state

from nemo_fp8_rl.cli import compare, recipes, refit, submit, train
from nemo_fp8_rl.cli import eval as eval_cli
from nemo_fp8_rl.cli.common import SEEDS_SYNTAX, invoke
from nemo_fp8_rl.cli.usage import EXIT_CODES, version
from nemo_fp8_rl.config import find_recipes, load_recipe, project_root, short_name
from nemo_fp8_rl.config.schema import DERIVED

BIN = Path(sys.executable).parent
MAINS = {
    "recipes": recipes.main,
    "train": train.main,
    "submit": submit.main,
    "compare": compare.main,
    "refit": refit.main,
    "eval": eval_cli.main,
}


def _nemo_rl_importable() -> bool:
    from nemo_fp8_rl.engines.nemo.driver.compat import available

    return available()[0]


def _fill(text: str, ws: Path) -> str:
    return text.replace("{ws}", str(ws))


def _prepare(case: Case, tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    if case.code == 3 and _nemo_rl_importable():
        pytest.skip("NeMo RL is importable here: the engine is usable")
    return prepare_case(case, tmp_path, lambda: None, monkeypatch)


def check_voice(case: Case, code: int, out: str, err: str, ws: Path) -> None:
    """Exit code, fragment, no traceback; a failure is one located error line with a fix."""
    check_case_output(case, code, out, err, ws)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_catalogue(case: Case, tmp_path, monkeypatch, capsys) -> None:
    ws, argv = _prepare(case, tmp_path, monkeypatch)
    before = tree_state(ws)
    code = invoke(MAINS[case.command], argv, prog=f"nemo_fp8_rl.{case.command}")
    captured = capsys.readouterr()
    check_voice(case, code, captured.out, captured.err, ws)
    if not case.changes:
        assert tree_state(ws) == before, "the command changed files although it failed"


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_cli_console_script(case: Case, tmp_path, monkeypatch) -> None:
    ws, argv = _prepare(case, tmp_path, monkeypatch)
    proc = subprocess.run(
        [str(BIN / f"nemo_fp8_rl.{case.command}"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    check_voice(case, proc.returncode, proc.stdout, proc.stderr, ws)


# ---- closed pipes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["nemo_fp8_rl.train", "--recipe", T, "--dry-run"],
        ["nemo_fp8_rl.recipes", "show", F, "--sources"],
    ],
    ids=["train-dry-run", "recipes-show"],
)
def test_closed_pipe_ends_quietly(argv, tmp_path) -> None:
    """`cmd | head -1`: the command ends as a program killed by SIGPIPE does (status 141 in
    the shell), with nothing on stderr. The pipe's reader is closed before the command starts,
    so every write meets a closed pipe, whatever the machine's speed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


# ---- --help, --version, exit codes -----------------------------------------------------------

HELP = {
    "train": ["--recipe", "--engine", "--run-dir", "--resume", "--overwrite", "--dry-run",
              "--preflight", "--no-progress", "--seeds", "--parallel"],
    "submit": ["--recipe", "--account", "--partition", "--time", "--container", "--mounts",
               "--job-name", "--nodes", "--run-dir", "--resume", "--overwrite", "--template",
               "--seeds", "--dry-run", "--no-preflight", "--eval", "--checkpoint", "--suite",
               "--data-dir", "status", "logs", "cancel", "--ray", "--wait"],
    "compare": ["--out", "--no-plots", "--tolerance-points", "--json"],
    "recipes": ["list", "show", "validate", "cp"],
    "refit": ["export"],
    "eval": ["--run", "--checkpoint", "--suite", "--data-dir", "--num-problems"],
}  # fmt: skip
SUB_HELP = [
    ("recipes", ["list", "--help"], ["--json", "PATTERN"]),
    ("recipes", ["show", "--help"], ["--sources", "~key"]),
    ("recipes", ["cp", "--help"], ["--overwrite"]),
    ("recipes", ["validate", "--help"], []),
    ("refit", ["export", "--help"], ["--scheme", "--pow2", "--shard-size-mb"]),
    ("submit", ["status", "--help"], ["--ray", "--wait"]),
]


def _help(command: str, argv: list[str], capsys) -> str:
    assert invoke(MAINS[command], argv, prog=f"nemo_fp8_rl.{command}") == 0
    return capsys.readouterr().out


def _plain(text: str) -> None:
    """Help text for a terminal: no Markdown, no internal module paths."""
    assert "`" not in text and "**" not in text, text
    assert not re.search(r"nemo_fp8_rl\.(cli|config|engines|analysis|evals|runs|slurm)\b", text)
    assert ".py" not in text, text


@pytest.mark.parametrize("command", sorted(HELP))
def test_help_names_every_flag_an_example_and_the_exit_codes(command, capsys) -> None:
    text = _help(command, ["--help"], capsys)
    for flag in [*HELP[command], "--debug", "--version", "--help"]:
        assert flag in text, f"{flag} missing from {command} --help"
    assert "example" in text and f"nemo_fp8_rl.{command} " in text.split("example")[-1]
    for code, _ in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s", text, re.M), f"exit code {code} missing"
    _plain(text)


@pytest.mark.parametrize(
    "command,argv,flags", SUB_HELP, ids=[" ".join(a[:1] + [c]) for c, a, _ in SUB_HELP]
)
def test_subcommand_help(command, argv, flags, capsys) -> None:
    text = _help(command, argv, capsys)
    for flag in [*flags, "exit codes"]:
        assert flag in text
    _plain(text)


@pytest.mark.parametrize("command", sorted(MAINS))
def test_version(command, capsys) -> None:
    assert invoke(MAINS[command], ["--version"], prog=f"nemo_fp8_rl.{command}") == 0
    assert capsys.readouterr().out.strip() == f"nemo_fp8_rl.{command} {version()}"


def test_version_console_script() -> None:
    proc = subprocess.run(
        [str(BIN / "nemo_fp8_rl.submit"), "--version"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"nemo_fp8_rl.submit {version()}"


def test_docs_document_every_exit_code() -> None:
    readme = (project_root() / "docs" / "commands.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n#", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.M))
    assert {int(c) for c in rows} == {c for c, _ in EXIT_CODES}


def test_train_and_submit_take_the_same_seed_syntax(capsys) -> None:
    for command in ("train", "submit"):
        text = " ".join(_help(command, ["--help"], capsys).split())
        assert f"seeds as {SEEDS_SYNTAX}" in text, command


def test_unknown_recipe_names_a_few_close_names_not_all(capsys) -> None:
    assert invoke(train.main, ["--recipe", "qwen3-8b-base/grpo-qwen3-8b-bse-1n8g-fp8"]) == 2
    err = capsys.readouterr().err
    named = [short_name(p) for p in find_recipes() if short_name(p) in err]
    assert "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8" in named and len(named) <= 3, err


# ---- recipes the torchtune way -----------------------------------------------------------------


def _without_derived(config: dict) -> dict:
    config = json.loads(json.dumps(config))
    for dotted in DERIVED:
        *parents, leaf = dotted.split(".")
        node = config
        for key in parents:
            node = node[key]
        node.pop(leaf)
    return config


def test_every_recipe_copies_to_the_same_configuration(tmp_path) -> None:
    from nemo_fp8_rl.config.recipe_copy import copy_recipe

    for path in find_recipes():
        dest = copy_recipe(short_name(path), tmp_path / f"{path.stem}-copy.yaml")
        original, copy = load_recipe(path), load_recipe(dest)
        assert _without_derived(copy.config) == _without_derived(original.config), path
        assert copy.name == f"{path.stem}-copy"
        assert "../" not in dest.read_text(), "a relative parent would break when moved"


def test_copy_keeps_comments_and_loads_from_anywhere(tmp_path) -> None:
    """The copy over its defaults (`--defaults`), moved to another folder, loads in a fresh
    process started elsewhere."""
    assert invoke(recipes.main, ["cp", F, str(tmp_path / "mine.yaml"), "--defaults"]) == 0
    text = (tmp_path / "mine.yaml").read_text()
    original = (project_root() / f"recipes/{F}.yaml").read_text()
    comments = [line for line in original.splitlines() if line.startswith("#")]
    assert comments and all(line in text.splitlines() for line in comments)
    assert (
        "defaults:\n  - tiny/grpo-tiny-qwen3-cpu-bf16\n  - configs/precision/fp8-blockwise" in text
    )
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "mine.yaml"
    (tmp_path / "mine.yaml").rename(moved)
    env = {k: v for k, v in os.environ.items() if k != "NEMO_FP8_RL_HOME"}
    proc = subprocess.run(
        [str(BIN / "nemo_fp8_rl.recipes"), "show", "mine.yaml", "--sources"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path / "elsewhere", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert _without_derived(shown) == _without_derived(load_recipe(F).config)
    assert "configs/precision/fp8-blockwise.yaml" in proc.stdout  # provenance names the parent


def test_copy_is_the_whole_configuration_by_default(tmp_path) -> None:
    """As torchtune's `tune cp`: every key of the resolved recipe, no `defaults:`."""
    assert invoke(recipes.main, ["cp", F, str(tmp_path / "mine.yaml")]) == 0
    text = (tmp_path / "mine.yaml").read_text()
    assert (
        "\ndefaults:" not in text
        and "  fp8_recipe: blockwise  # configs/precision/fp8-blockwise.yaml" in text
    )
    assert _without_derived(load_recipe(str(tmp_path / "mine.yaml")).config) == _without_derived(
        load_recipe(F).config
    )


def test_copy_of_a_recipe_outside_the_project_keeps_its_parents_by_absolute_path(tmp_path):
    from nemo_fp8_rl.config.recipe_copy import copy_recipe

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "base.yaml").write_text(f"defaults: {T}\ngrpo:\n  max_num_steps: 9\n")
    (tmp_path / "mine" / "r.yaml").write_text("defaults: ./base.yaml  # my base\nenv: {}\n")
    (tmp_path / "other").mkdir()
    dest = copy_recipe(str(tmp_path / "mine" / "r.yaml"), tmp_path / "other")
    assert dest.read_text() == f"defaults:\n  - {tmp_path / 'mine' / 'base.yaml'}\nenv: {{}}\n"
    assert load_recipe(dest).config["grpo"]["max_num_steps"] == 9


def test_copy_never_replaces_a_file_unasked(tmp_path, capsys) -> None:
    """An existing file is left byte for byte as it was."""
    target = tmp_path / "mine.yaml"
    target.write_text("my notes\n")
    assert invoke(recipes.main, ["cp", T, str(target)]) == 2
    assert f"error: {target}: already exists. Fix:" in capsys.readouterr().err
    assert target.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


def test_delete_override_removes_the_key_and_only_it() -> None:
    before = load_recipe(Q)
    key = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
    assert key in before.config["policy"]["megatron_cfg"]["env_vars"]
    after = load_recipe(Q, [f"~policy.megatron_cfg.env_vars.{key}"])
    assert key not in after.config["policy"]["megatron_cfg"]["env_vars"]
    after.config["policy"]["megatron_cfg"]["env_vars"][key] = before.config["policy"][
        "megatron_cfg"
    ]["env_vars"][key]
    assert after.config == before.config
    assert f"policy.megatron_cfg.env_vars.{key}" not in after.provenance


def test_delete_then_set_again_in_order() -> None:
    """Overrides apply left to right, as Hydra's: delete, then add back with a new value."""
    r = load_recipe(T, ["~env.math.num_workers", "env.math.num_workers=3"])
    assert r.config["env"]["math"]["num_workers"] == 3
    assert r.provenance["env.math.num_workers"] == "override"


# ---- machine-readable listings and verdicts -----------------------------------------------------


def test_recipes_list_json_and_filter(capsys) -> None:
    assert invoke(recipes.main, ["list", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert len(every) == len(find_recipes())
    tiny = next(r for r in every if r["name"] == F)
    assert tiny["cluster"] == "cpu" and tiny["calibration"] == "on"
    assert Path(tiny["path"]).is_file()
    assert invoke(recipes.main, ["list", "--json", "tiny/*fp8*"]) == 0
    picked = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert picked and all(n.startswith("tiny/") and "fp8" in n for n in picked)
    assert invoke(recipes.main, ["list", "kvcache"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and "fp8-kvcache" in table[1]


def test_recipes_list_filter_matching_nothing_says_so(capsys) -> None:
    assert invoke(recipes.main, ["list", "--json", "nosuchthing"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ERROR_LINE.search(captured.err) and "no recipe matches 'nosuchthing'" in captured.err


@pytest.fixture
def two_runs(tmp_path):
    from test_compare import write_project_run

    write_project_run(tmp_path / "bf16", 10, precision="bf16", acc_final=0.6, step_s=2.0)
    write_project_run(tmp_path / "fp8", 10, precision="fp8", acc_final=0.3, step_s=1.0)
    return tmp_path


def test_compare_json_prints_the_verdict_and_writes_verdict_json(two_runs, capsys) -> None:
    out = two_runs / "report"
    argv = [str(two_runs / "bf16"), str(two_runs / "fp8"), "--out", str(out), "--no-plots"]
    assert invoke(compare.main, [*argv, "--json"]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # stdout holds the JSON only; the table went to stderr
    assert "wrote" in captured.err
    assert printed == json.loads((out / "verdict.json").read_text())
    assert (out / "report.md").is_file()
    assert printed["kind"] == "runs" and printed["reference"] == "bf16" and not printed["ok"]
    (fp8,) = printed["verdicts"]
    assert fp8["name"] == "fp8" and fp8["outcome"] == "lower"
    assert fp8["accuracy_gap_points"] == pytest.approx(-30.0)
    assert fp8["speedup"] == pytest.approx(2.0, rel=0.05)
    assert fp8["text"].startswith("fp8 (FP8): below BF16: -30.0 points")


def test_compare_over_seeds_writes_the_interval(tmp_path, capsys) -> None:
    from test_groups import write_seed_run

    for seed, acc in {1: 0.50, 2: 0.60, 3: 0.70}.items():
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=acc, clip=0.01)
        write_seed_run(tmp_path, "fp8", seed, fp8=True, acc=acc + 0.001 * seed, clip=0.02)
    out = tmp_path / "report"
    argv = [str(tmp_path / "bf16"), str(tmp_path / "fp8"), "--out", str(out), "--no-plots"]
    assert invoke(compare.main, argv) == 0
    capsys.readouterr()
    verdict = json.loads((out / "verdict.json").read_text())
    (fp8,) = verdict["verdicts"]
    assert verdict["kind"] == "groups" and fp8["seeds"] == [1, 2, 3]
    assert fp8["interval"]["n"] == 3 and fp8["interval"]["paired"]
    assert fp8["outcome"] == "higher" or fp8["outcome"] == "within_noise"
    assert fp8["interval"]["low"] <= fp8["accuracy_gap_points"] <= fp8["interval"]["high"]
