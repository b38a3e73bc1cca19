"""sbatch rendering: every recipe renders to valid bash, one golden script, GPU and container lines
only when asked for, values quoted (injection attempts stay data), bad values rejected early."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
from nemo_fp8_rl.slurm import JobSpecError, build_job_spec, frozen_recipe_text, render_sbatch
from nemo_fp8_rl.slurm.spec import split_mounts

GOLDEN = Path(__file__).parent / "golden" / "grpo-qwen3-30b-a3b-2n8g-fp8.sbatch"
FIXED = {"workdir": Path("/work/project"), "python_bin_dir": None}


def _spec(ref: str, overrides=(), flags=None, run_dir: Path = Path("/runs/r"), **kw):
    recipe = load_recipe(ref, list(overrides), run_dir=run_dir)
    frozen = Path(recipe.run_dir) / "slurm" / f"{recipe.name}.yaml"
    return recipe, build_job_spec(recipe, frozen, flags=flags, **{**FIXED, **kw})


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _header(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("path", find_recipes(), ids=short_name)
def test_every_recipe_renders_to_valid_bash(path, tmp_path):
    _, spec = _spec(str(path), run_dir=tmp_path / "run")
    script = render_sbatch(spec)
    _bash_n(script, tmp_path)
    assert f"#SBATCH --nodes={spec.nodes}" in script
    assert f'#SBATCH --output="{tmp_path}/run/slurm/slurm-%j.out"' in script


def test_golden_multi_node_script(tmp_path):
    """A 2-node, 8-GPU recipe with account, partition, container and mounts, byte for byte."""
    flags = {
        "account": "acct",
        "partition": "batch",
        "time": "01:30:00",
        "container": "nvcr.io/nvidia/nemo-rl:v0.7.0",
        "mounts": split_mounts("/lustre/data:/data:ro,/lustre/ckpt:/ckpt"),
    }
    overrides = ["slurm.env.HF_HOME=/lustre/hf", "slurm.setup_command=source /opt/env.sh"]
    _, spec = _spec("qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8", overrides, flags)
    script = render_sbatch(spec)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text(), (
        "rendering changed; rerun with UPDATE_GOLDEN=1 and review the diff"
    )
    _bash_n(script, tmp_path)


def test_gpu_lines_follow_gpus_per_node():
    _, gpu = _spec("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    gpu_script = render_sbatch(gpu)
    assert '#SBATCH --gres="gpu:8"' in _header(gpu_script)
    assert "STEP_GRES=gpu:8" in gpu_script
    _, cpu = _spec("tiny/grpo-tiny-qwen3-cpu-fp8")
    cpu_script = render_sbatch(cpu)
    assert not [line for line in _header(cpu_script) if re.search("gres|gpu", line)]
    assert "STEP_GRES=''" in cpu_script


def test_gres_override_replaces_derived_gpu_request():
    _, spec = _spec("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", ["slurm.gres_per_node=gpu:h100:8"])
    assert '#SBATCH --gres="gpu:h100:8"' in _header(render_sbatch(spec))


def test_pyxis_flags_only_with_a_container():
    _, plain = _spec("tiny/grpo-tiny-qwen3-cpu-fp8")
    assert "--container" not in render_sbatch(plain)
    assert "CONTAINER_ARGS=()" in render_sbatch(plain)
    with pytest.raises(JobSpecError, match="mounts are set but no container"):
        _spec("tiny/grpo-tiny-qwen3-cpu-fp8", flags={"mounts": ("/a:/b",)})
    _, boxed = _spec(
        "tiny/grpo-tiny-qwen3-cpu-fp8", flags={"container": "img", "mounts": ("/a:/b",)}
    )
    text = render_sbatch(boxed)
    assert "--container-image=img" in text and "--container-mounts=/a:/b" in text


def test_flags_override_recipe_and_nodes_cannot_shrink():
    flags = {"account": "flag-acct", "nodes": 2, "time": "00:05:00"}
    _, spec = _spec("tiny/grpo-tiny-qwen3-cpu-fp8", ["slurm.account=recipe-acct"], flags)
    header = _header(render_sbatch(spec))
    assert '#SBATCH --account="flag-acct"' in header and "#SBATCH --nodes=2" in header
    assert '#SBATCH --time="00:05:00"' in header
    with pytest.raises(JobSpecError, match="fewer than the recipe's cluster.num_nodes=2"):
        _spec("qwen3-30b-a3b/grpo-qwen3-30b-a3b-2n8g-fp8", flags={"nodes": 1})


INJECT = "$(touch {c})`touch {c}`;touch {c}'\"$(touch {c})"


def _settings_block(script: str) -> str:
    start = script.index("# ---- settings")
    return script[start : script.index("# ---- job")]


def test_injection_attempts_stay_data(tmp_path):
    """Hostile values in job name, account, mounts, env values and overrides: bash runs the
    rendered header and settings, nothing is executed, and every value arrives unchanged."""
    canary = tmp_path / "canary"
    evil = INJECT.format(c=canary).replace('"', "").replace("\\", "")  # header-safe variant
    full = INJECT.format(c=canary)
    mount = "/x:/y" + full
    overrides = [
        f"slurm.env.EVIL={json.dumps(full)}",
        f"slurm.mounts={json.dumps([mount])}",
        f"slurm.container={json.dumps(full)}",
    ]
    run_dir = tmp_path / "run $(touch canary)"
    _, spec = _spec(
        "tiny/grpo-tiny-qwen3-cpu-fp8",
        overrides,
        {"job_name": evil, "account": evil},
        run_dir=run_dir,
    )
    script = render_sbatch(spec)
    _bash_n(script, tmp_path)
    assert f'#SBATCH --job-name="{evil}"' in _header(script)
    probe = _settings_block(script) + (
        'printf "%s\\n" "$RUN_DIR" "$EVIL" "${CONTAINER_ARGS[0]}" "${CONTAINER_ARGS[4]}"\n'
    )
    out = subprocess.run(["bash", "-euc", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        str(run_dir),
        full,
        f"--container-image={full}",
        f"--container-mounts={mount}",
    ]
    assert not canary.exists() and not (tmp_path / "canary").exists()


@pytest.mark.parametrize(
    ("flags", "overrides", "match"),
    [
        ({"job_name": "a\nb"}, [], r"job name: .* control character '\\n'"),
        ({"account": "a\n#SBATCH --uid=0"}, [], r"slurm.account / --account: .*control"),
        ({}, ["slurm.env.X=" + json.dumps("ok\nexport Y=1")], r"slurm.env.X: .*control character"),
        ({"mounts": ("/a:/b\r",)}, [], r"slurm.mounts\[0\]: .*control character '\\r'"),
        ({}, ["slurm.setup_command=" + json.dumps("echo\x07")], r"slurm.setup_command: .*'\\x07'"),
        ({"partition": 'p"q'}, [], r"slurm.partition / --partition: .*contains \""),
        ({"time": "soon"}, [], r"slurm.time: 'soon' is not a Slurm time limit"),
        ({}, ["slurm.env={'1X': 'v'}"], r"'1X' is not a valid environment variable name"),
        ({}, ["slurm.extra_sbatch_args=['qos=high']"], r"'qos=high' is not an sbatch option"),
    ],
)
def test_bad_values_rejected_before_rendering(flags, overrides, match):
    with pytest.raises(JobSpecError, match=match):
        _spec("tiny/grpo-tiny-qwen3-cpu-fp8", overrides, flags)


def test_extra_sbatch_args_are_quoted():
    _, spec = _spec(
        "tiny/grpo-tiny-qwen3-cpu-fp8", ["slurm.extra_sbatch_args=['--qos=high', '--requeue']"]
    )
    header = _header(render_sbatch(spec))
    assert '#SBATCH --qos="high"' in header and "#SBATCH --requeue" in header


def test_frozen_recipe_reloads_to_the_same_config(tmp_path):
    recipe = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", ["grpo.max_num_steps=3"], run_dir=tmp_path)
    frozen = tmp_path / f"{recipe.name}.yaml"
    frozen.write_text(frozen_recipe_text(recipe))
    again = load_recipe(frozen, run_dir=tmp_path)
    assert again.name == recipe.name and again.config == recipe.config


def test_cli_dry_run_prints_script_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc = submit_cli.main(
        [
            "--recipe",
            "tiny/grpo-tiny-qwen3-cpu-fp8",
            "--run-dir",
            str(run_dir),
            "--dry-run",
            "--account",
            "a",
            "grpo.max_num_steps=2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("#!/bin/bash") and '#SBATCH --account="a"' in out
    assert not run_dir.exists()


def test_cli_flags_may_follow_overrides(capsys):
    args = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "grpo.max_num_steps=2", "--dry-run"]
    assert submit_cli.main([*args, "--partition", "p"]) == 0
    assert '#SBATCH --partition="p"' in capsys.readouterr().out


def test_cli_resume_reaches_the_training_command(capsys):
    args = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "--dry-run"]
    assert submit_cli.main(args) == 0
    assert "TRAIN_RESUME=''" in capsys.readouterr().out
    assert submit_cli.main([*args, "--resume"]) == 0
    script = capsys.readouterr().out
    assert "TRAIN_RESUME=--resume" in script and '${TRAIN_RESUME:+"$TRAIN_RESUME"}' in script


def test_cli_reports_bad_input(capsys):
    argv = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "--dry-run", "--mounts", "a:b,,c"]
    assert invoke(submit_cli.main, argv) == 2
    assert "--mounts: '' is not a mount" in capsys.readouterr().err
    argv = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8", "--dry-run", "grpo.nope=1"]
    assert invoke(submit_cli.main, argv) == 2
    assert invoke(submit_cli.main, ["status", "12;rm"]) == 1
    assert "job id '12;rm': not a Slurm job id" in capsys.readouterr().err


@pytest.mark.parametrize(
    "path", [GOLDEN, Path(__file__).parents[1] / "scripts" / "local-slurm.sh"], ids=lambda p: p.name
)
def test_shellcheck_clean(path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(
        ["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def _gpu_run(tmp_path) -> Path:
    """A run directory of a GPU recipe, as training leaves it (recipe.yaml, and one NeMo RL
    checkpoint with its training_info.json and Megatron weights folder)."""
    recipe = load_recipe(
        "paper-fp8-rl/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-8k-fp8-blockwise",
        run_dir=tmp_path / "run",
    )
    run = Path(recipe.run_dir)
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(recipe.to_yaml())
    step = run / "checkpoints" / "step_20"
    (step / "policy" / "weights" / "iter_0000020").mkdir(parents=True)
    (step / "training_info.json").write_text('{"val:accuracy": 0.3}')
    return run


def test_cli_eval_dry_run_renders_a_one_node_evaluation_job(tmp_path, capsys):
    run = _gpu_run(tmp_path)
    args = ["--eval", str(run), "--checkpoint", "best", "--suite", "math8", "--dry-run"]
    assert submit_cli.main([*args, "--account", "acct", "--partition", "batch"]) == 0
    script = capsys.readouterr().out
    assert f'#SBATCH --job-name="eval-{run.name}"' in script and "#SBATCH --nodes=1" in script
    assert "EVAL_CHECKPOINT=best" in script and "EVAL_SUITE=math8" in script
    assert f"RUN_DIR={run.absolute()}" in script
    assert (
        'exec python -m nemo_fp8_rl.eval --run "$RUN_DIR" --checkpoint "$EVAL_CHECKPOINT"' in script
    )
    _bash_n(script, tmp_path)
    assert not (run / "slurm").exists()  # a dry run writes nothing


def test_cli_eval_of_a_missing_run_is_an_error(tmp_path, capsys):
    assert invoke(submit_cli.main, ["--eval", str(tmp_path / "nope"), "--dry-run"]) != 0
    assert "is not a run directory" in capsys.readouterr().err
