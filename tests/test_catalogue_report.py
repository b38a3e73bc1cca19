"""Commands that write or read results: every case of `catalogue_report_cases.CASES` ends as
expected (the harness of `test_catalogue.py`), plus the checks one command line cannot make:
compare folders of different comparisons never collide, exported checkpoints are readable by
others, the shape checks pass on the real models' configs, and a garbled checkpoint record does
not stop the evaluation of another checkpoint (a real tiny run, slow).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from catalogue_cases import write_tiny_hf
from catalogue_report_cases import CASES
from test_catalogue import MAINS, check_case_output, hf_source, prepare_case, tree_state
from test_compare import write_project_run

from nemo_fp8_rl.cli import compare
from nemo_fp8_rl.cli import eval as eval_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import project_root

COMMANDS = {**MAINS, "eval": eval_cli.main}
__all__ = ["hf_source"]  # the session fixture, shared with test_catalogue.py


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_catalogue_report(case, tmp_path, hf_source, monkeypatch, capsys) -> None:
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    capsys.readouterr()  # what the setup printed
    before = tree_state(ws)
    code = invoke(COMMANDS[case.command], argv, prog=f"nemo_fp8_rl.{case.command}")
    captured = capsys.readouterr()
    check_case_output(case, code, captured.out, captured.err, ws)
    if not case.changes:
        assert tree_state(ws) == before, "the command changed files although it failed"


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_console_script_prints_no_traceback(case, tmp_path, hf_source, monkeypatch) -> None:
    ws, argv = prepare_case(case, tmp_path, hf_source, monkeypatch)
    before = tree_state(ws)
    script = Path(sys.executable).parent / f"nemo_fp8_rl.{case.command}"
    proc = subprocess.run(
        [str(script), *argv], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    check_case_output(case, proc.returncode, proc.stdout, proc.stderr, ws)
    assert tree_state(ws) == before


# ---- compare: one folder per comparison --------------------------------------------------------


def _compare(*argv: str) -> int:
    return invoke(compare.main, [*map(str, argv), "--no-plots"], "nemo_fp8_rl.compare")


def test_default_folders_name_every_input_and_never_collide(tmp_path, monkeypatch, capsys):
    """`compare A B C`, `compare A B`, the seed groups and one seed of each: four folders."""
    monkeypatch.chdir(tmp_path)
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    write_project_run(a, 10, precision="bf16", acc_final=0.6, step_s=2.0)
    write_project_run(b, 10, precision="fp8", acc_final=0.6, step_s=1.5)
    write_project_run(c, 10, precision="fp8", acc_final=0.5, step_s=1.4)
    for name, precision in (("g-bf16", "bf16"), ("g-fp8", "fp8")):
        for seed in (1, 2):
            run = write_project_run(
                tmp_path / name / f"seed-{seed}", 10, precision=precision, acc_final=0.6, step_s=2
            )
            recipe = (run / "recipe.yaml").read_text()
            (run / "recipe.yaml").write_text(recipe.replace("seed: 1", f"seed: {seed}"))
    commands = [
        (a, b, c),
        (a, b),
        (tmp_path / "g-bf16", tmp_path / "g-fp8"),
        (tmp_path / "g-bf16/seed-1", tmp_path / "g-fp8/seed-1"),
    ]
    folders = []
    for items in commands:
        before = set((tmp_path / "results").glob("compare-*"))
        assert _compare(*items) == 0, capsys.readouterr().err
        (folder,) = set((tmp_path / "results").glob("compare-*")) - before
        record = json.loads((folder / "inputs.json").read_text())
        assert record["inputs"] == [str(p.resolve()) for p in items]
        assert "report.md" in record["files"] and (folder / "report.md").is_file()
        folders.append(folder)
    assert folders[0].name.startswith("compare-a-vs-b-vs-c-")
    assert folders[1].name.startswith("compare-a-vs-b-") and "-vs-c" not in folders[1].name
    assert len({f.name for f in folders}) == 4
    # The same comparison again writes into its own folder; nothing else changes.
    first = (folders[1] / "report.md").read_bytes()
    assert _compare(a, b) == 0
    assert (folders[1] / "report.md").read_bytes() == first
    assert len(list((tmp_path / "results").glob("compare-*"))) == 4


def test_rewriting_a_comparison_removes_its_stale_files(tmp_path, monkeypatch, capsys):
    """--overwrite of a grouped comparison by a two-run one leaves no file of the first behind."""
    monkeypatch.chdir(tmp_path)
    write_project_run(tmp_path / "a", 10, precision="bf16", acc_final=0.6, step_s=2.0)
    write_project_run(tmp_path / "b", 10, precision="fp8", acc_final=0.6, step_s=1.5)
    out = tmp_path / "rep"
    out.mkdir()
    (out / "mine.txt").write_text("kept\n")
    assert _compare(tmp_path / "a", tmp_path / "b", "--out", out, "--overwrite") == 0
    stale = out / "plots" / "old.png"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"png")
    record = json.loads((out / "inputs.json").read_text())
    record["files"].append("plots/old.png")
    (out / "inputs.json").write_text(json.dumps(record))
    assert _compare(tmp_path / "a", tmp_path / "b", "--out", out) == 0
    assert not stale.exists() and (out / "mine.txt").read_text() == "kept\n"


def test_nan_metrics_are_counted_and_unknown_speed_explained(tmp_path, monkeypatch, capsys):
    """An FP8 run with every step time NaN and two reward points NaN/inf (see `nan_runs`)."""
    from catalogue_cases import Workspace
    from catalogue_report_cases import nan_runs

    monkeypatch.chdir(tmp_path)
    nan_runs(Workspace(tmp_path, lambda: tmp_path))
    assert _compare(tmp_path / "bf16", tmp_path / "fp8", "--out", tmp_path / "rep") == 0
    printed = " ".join(capsys.readouterr().out.split())
    report = " ".join((tmp_path / "rep/report.md").read_text().split())
    for text in (printed, report):
        assert "fp8: 5 metric(s) hold NaN, infinite or null points" in text
        assert "timing/train/total_step_time (10 of 10)" in text
        assert "train/reward (2 of 10)" in text
        assert (
            "speed unknown (fp8: timing/train/total_step_time has 0 finite of 10 points, 10 NaN "
            "or infinite (the speedup needs 2, the first being warm-up))" in text
        )


# ---- refit export: readable by others, checks that hold on real models -------------------------


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
    }


@pytest.mark.parametrize(
    ("umask", "folder", "file"), [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)]
)
def test_export_modes_follow_the_umask(tmp_path, umask, folder, file) -> None:
    from nemo_fp8_rl.refit.export import convert_checkpoint

    src = write_tiny_hf(tmp_path / "src")
    (src / "generation_config.json").chmod(0o600)  # a private side file is not copied as such
    old = os.umask(umask)
    try:
        fp8 = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}
        convert_checkpoint(src, tmp_path / "out", fp8, shard_bytes=2**16)
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "out")
    assert len(modes) > 4 and any(name.startswith("model-0000") for name in modes)
    for name, mode in modes.items():
        assert mode == (folder if (tmp_path / "out" / name).is_dir() else file), (name, oct(mode))


def test_shape_checks_accept_every_supported_model_config() -> None:
    """The configs the recipes train (real HF configs) against the shapes transformers builds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from nemo_fp8_rl.refit.export import hf_shapes
    from nemo_fp8_rl.refit.source import SUPPORTED, check_architecture, shape_problems

    files = sorted((project_root() / "nemo_fp8_rl/engines/nemo/model_configs").glob("*.json"))
    configs = {path: json.loads(path.read_text()) for path in files}
    # DeepSeek-V3 and Moonlight (MLA) are refit by NeMo RL's path, not the export bridge.
    exported = {
        p: c for p, c in configs.items() if set(c.get("architectures", [])) <= set(SUPPORTED)
    }
    assert len(exported) >= 5 and len(exported) < len(configs)
    for path, config in exported.items():
        check_architecture(config, path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        shapes = dict(hf_shapes({n: tuple(t.shape) for n, t in model.state_dict().items()}))
        assert shape_problems(config, shapes) == [], path.name
        config["hidden_size"] += 64
        assert any("hidden_size is" in p for p in shape_problems(config, shapes)), path.name


# ---- eval: a garbled record of one checkpoint does not stop another ----------------------------


def test_select_local_skips_a_garbled_record_of_another_checkpoint(tmp_path) -> None:
    from nemo_fp8_rl.evals.checkpoints import CheckpointError, select_local

    for step, info in ((1, "{garbled"), (2, '{"step": 2, "validation/accuracy": 0.5}'), (3, "7")):
        folder = tmp_path / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "info.json").write_text(info)
    assert select_local(tmp_path, "step_2").step == 2
    with pytest.raises(CheckpointError, match=r"step_3/info.json: not a JSON object"):
        select_local(tmp_path, "last")  # the newest record is unreadable: say so, pick nothing
    with pytest.raises(CheckpointError, match=r"cannot rank the checkpoints: step_1/info.json"):
        select_local(tmp_path, "best")


@pytest.mark.slow
def test_real_run_evaluates_step_2_despite_a_garbled_step_1(tmp_path, monkeypatch, capsys):
    from tiny_fast import TWO_STEPS

    from nemo_fp8_rl.cli import train

    monkeypatch.setenv("NEMO_FP8_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = tmp_path / "run"
    fast = [*TWO_STEPS, "checkpointing.save_period=1", "grpo.num_prompts_per_step=8"]
    fast += ["policy.train_global_batch_size=16", "policy.train_micro_batch_size=16"]
    args = ["--recipe", "tiny/grpo-tiny-qwen3-cpu-bf16", "--run-dir", str(run), "--no-progress"]
    assert invoke(train.main, [*args, *fast], "nemo_fp8_rl.train") == 0, capsys.readouterr().err
    (run / "checkpoints/step_1/info.json").write_text("{garbled")
    argv = ["--run", str(run), "--checkpoint", "step_2", "--num-problems", "4"]
    assert invoke(eval_cli.main, argv, "nemo_fp8_rl.eval") == 0, capsys.readouterr().err
    result = json.loads((run / "eval/addition.step_2.json").read_text())
    assert result["checkpoint"]["step"] == 2
    assert set(result["benchmarks"]) == {"add2-heldout", "add3"}
