"""`submit` of a GPU recipe checks that the job's Python (this interpreter, without a container
or setup command) can run NeMo RL: a dry run says a real submit would be refused, a real submit is
refused with one located line (exit 3) before anything is written or queued."""

from __future__ import annotations

import pytest

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.submit import main
from nemo_fp8_rl.engines import nemo

GPU = [
    "--recipe",
    "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8",
    "--account",
    "A",
    "--partition",
    "P",
]

pytestmark = pytest.mark.skipif(
    nemo.available()[0], reason="NeMo RL runs here: the job's Python can run the engine"
)


def test_a_dry_run_prints_the_script_and_says_a_real_submit_is_refused(tmp_path, capsys):
    argv = [*GPU, "--run-dir", str(tmp_path / "run"), "--dry-run"]
    assert invoke(main, argv) == 0
    out = capsys.readouterr()
    assert out.out.startswith("#!/bin/bash")
    assert (
        "note: a real submit from here is refused: the job runs grpo-qwen3-8b-base-1n8g-fp8 "
        in out.err
    )
    assert "(NeMo RL is not importable), so it would hold 8 GPU(s) and exit 3" in out.err


def test_a_real_submit_is_refused_before_anything_is_queued(tmp_path, capsys):
    assert invoke(main, [*GPU, "--run-dir", str(tmp_path / "run")]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after the guard rails' table
    assert line.startswith("error: ") and "(the job's Python): the job runs" in line
    assert "Fix: submit from NeMo RL's environment" in line and "--container IMAGE" in line
    assert not (tmp_path / "run" / "slurm").exists()  # no job script written, nothing queued


def test_a_job_in_a_container_brings_its_own_environment(tmp_path, capsys):
    argv = [
        *GPU,
        "--run-dir",
        str(tmp_path / "run"),
        "--container",
        "nvcr.io/nvidia/nemo-rl:v0.7.0",
        "--dry-run",
    ]
    assert invoke(main, argv) == 0
    assert "refused" not in capsys.readouterr().err
