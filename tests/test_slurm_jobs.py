"""Job commands without a cluster: bad job ids, missing Slurm commands, unparsable scripts."""

from __future__ import annotations

import pytest

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.slurm import SlurmError, submit
from nemo_fp8_rl.slurm.jobs import JobStatus, check_job_id


@pytest.mark.parametrize("job_id", ["", "12;rm -rf /", "$(id)", "1 2", "-1", "12_"])
def test_job_ids_other_than_numbers_are_refused(job_id):
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        check_job_id(job_id)


def test_array_job_ids_pass():
    assert check_job_id("123_4") == "123_4"


def test_missing_slurm_commands_give_a_fix(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without Slurm's client commands
    assert invoke(submit_cli.main, ["status", "7"]) == 1
    err = capsys.readouterr().err
    assert ": not found (Slurm's client commands are not installed here)" in err
    assert "scripts/local-slurm.sh up" in err


def test_unparsable_script_is_not_submitted(tmp_path):
    script = tmp_path / "broken.sbatch"
    script.write_text("#!/bin/bash\nif then fi\n")
    with pytest.raises(SlurmError, match="does not parse"):
        submit(script)


def test_final_states():
    assert JobStatus("1", "COMPLETED", "0:0").finished
    assert JobStatus("1", "CANCELLED").finished
    assert not JobStatus("1", "RUNNING").finished
    assert not JobStatus("1", "PENDING").finished
