"""Nothing deleted that the project did not create, nothing run that a file name holds: every
case of `catalogue_output_cases.CASES` ends as expected (the harness of `test_catalogue_safety`:
a bound on time, no traceback, a located error line, and for failures the scratch folder as it
was, symbolic links included), in-process and, for `subprocess` cases, as the console script.

The functions below the cases hold what a case cannot: a full disk under `recipes import`, the
model folder a run writes and a trained run's export (a child with a file-size limit), MLflow's
file store named by the environment, and the hand-set folder `--overwrite` used to remove.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from catalogue_output_cases import CASES, SUBPROCESS_ONLY
from test_catalogue_safety import (
    BOUND_S,
    COMMANDS,
    _limited,
    _prepare,
    hf_source,
    run_console_script,
    run_in_process,
)

from nemo_fp8_rl.cli import env as env_cli
from nemo_fp8_rl.cli import recipes


def complete(argv: list[str]) -> int:
    """Source the completion script in a real bash (started here) and print what it offers for
    the command line `argv` (the last word is the one being completed)."""
    from nemo_fp8_rl.cli.completion import bash_script

    script = Path(".completion.bash")  # removed below: the case's folder must stay as it was
    script.write_text(bash_script())
    words = " ".join("'" + w.replace("'", "'\\''") + "'" for w in argv)
    program = (
        f"source {script}; COMP_WORDS=({words}); COMP_CWORD={len(argv) - 1}; _nemo_fp8_rl; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    try:
        out = subprocess.run(
            ["bash", "-c", program], capture_output=True, text=True, timeout=BOUND_S
        )
    finally:
        script.unlink()
    print(out.stdout, end="")
    print(out.stderr, end="", file=sys.stderr)
    return out.returncode


def import_model(argv: list[str]) -> int:
    """`recipes import SRC OUT`, then OUT loaded: `model_name=<repr>` of its policy.model_name."""
    from nemo_fp8_rl.config import load_recipe

    code = recipes.main(["import", *argv])
    if code == 0:
        print(f"model_name={load_recipe(argv[1]).config['policy']['model_name']!r}")
    return code


__all__ = ["hf_source"]  # the session fixture, shared with test_catalogue.py
ALL_COMMANDS = {**COMMANDS, "complete": complete, "import-model": import_model, "env": env_cli.main}
IN_PROCESS = [c for c in CASES if c.id not in SUBPROCESS_ONLY]


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_catalogue_outputs(case, tmp_path, hf_source, monkeypatch, capsys) -> None:
    ws, argv = _prepare(case, tmp_path, hf_source, monkeypatch)
    run_in_process(case, ALL_COMMANDS, ws, argv, capsys)


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_console_script_prints_no_traceback(case, tmp_path, hf_source, monkeypatch) -> None:
    ws, argv = _prepare(case, tmp_path, hf_source, monkeypatch)
    run_console_script(case, ws, argv)


def test_catalogue_size() -> None:
    """The breakdown is printed with -s."""
    by_command = Counter(c.command for c in CASES)
    print(f"output catalogue: {len(CASES)} cases; by command {dict(by_command)}")
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.id for c in SUBPROCESS} >= SUBPROCESS_ONLY


# ---- full disks and what a case cannot show -----------------------------------------------


def _child(code: str, limit: int, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        cwd=cwd,
        preexec_fn=_limited(limit),
    )


def test_import_on_a_full_disk_keeps_the_recipe_it_replaces(tmp_path) -> None:
    """EFBIG while `recipes import --overwrite` writes: the recipe it was to replace is kept
    byte for byte (it was truncated to 0 bytes), no temporary file stays, one located line."""
    from test_nemo_import_cli import _nemo_shaped

    src = _nemo_shaped(tmp_path)
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults: tiny/grpo-tiny-qwen3-cpu-bf16\n# my edits\n")
    script = Path(sys.executable).parent / "nemo_fp8_rl.recipes"
    proc = subprocess.run(
        [str(script), "import", str(src), str(mine), "--overwrite"],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        preexec_fn=_limited(4096),
    )
    assert proc.returncode == 1, proc.stderr
    assert f"error: {mine}: File too large while writing; the previous file is kept" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert mine.read_text() == "defaults: tiny/grpo-tiny-qwen3-cpu-bf16\n# my edits\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine.yaml.")]


def test_model_folder_on_a_full_disk_is_a_located_error(tmp_path) -> None:
    """The tiny model a run saves as `model/` (save_pretrained): past the file-size limit the
    run stops with one DiskFull line naming the folder, and no half-written folder is left."""
    code = (
        "from pathlib import Path\n"
        "from nemo_fp8_rl.config.project import TinyModelConfig\n"
        "from nemo_fp8_rl.tiny.model import build_model, save_checkpoint\n"
        "from nemo_fp8_rl.tiny.tokenizer import build_tokenizer\n"
        "tok = build_tokenizer()\n"
        "save_checkpoint(build_model(TinyModelConfig(), tok, 0), tok, Path('run/model'))\n"
    )
    (tmp_path / "run").mkdir()
    proc = _child(code, 64 * 1024, tmp_path)
    assert "DiskFull" in proc.stderr and "run/model: File too large while writing" in proc.stderr
    assert "nothing was written" in proc.stderr
    assert list((tmp_path / "run").iterdir()) == []


def test_trained_run_export_on_a_full_disk_is_a_located_error(tmp_path) -> None:
    """`refit export` of a trained run writes a BF16 folder of its weights before converting:
    past the file-size limit that is one located line, exit 1, and nothing is left behind."""
    from test_first_hour import _trained_run  # model/ and a checkpoint, as a run leaves them

    run, _ = _trained_run(tmp_path)
    step = run / "checkpoints" / "step_1"
    out = tmp_path / "out"
    script = Path(sys.executable).parent / "nemo_fp8_rl.refit"
    proc = subprocess.run(
        [str(script), "export", str(step), str(out)],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        preexec_fn=_limited(64 * 1024),
    )
    assert proc.returncode == 1, proc.stderr
    assert f"error: {out}: File too large while writing; nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_mlflow_file_store_named_by_the_environment_opens(tmp_path, monkeypatch) -> None:
    """MLFLOW_TRACKING_URI=file:///folder: the probe before Ray allows MLflow 3's file store
    for it (it was allowed only for the default store, so the run failed minutes in)."""
    pytest.importorskip("mlflow")
    from nemo_fp8_rl.engines.local.backends import MlflowSink
    from nemo_fp8_rl.runs.endpoints import probe_loggers

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    probe_loggers({"logger": {"mlflow_enabled": True, "mlflow": {"tracking_uri": None}}})
    sink = MlflowSink({"experiment_name": "e", "run_name": "r"}, tmp_path / "logs")
    sink.log(1, {"train/reward": 0.5})
    sink.close()
    assert (tmp_path / "mlruns").is_dir()
