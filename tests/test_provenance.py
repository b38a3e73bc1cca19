"""Run provenance (nemo_fp8_rl.runs.provenance): what environment.json and the study archive record."""

import json
import subprocess

from nemo_fp8_rl.runs import provenance, rundir


def test_snapshot_names_this_checkout_and_machine():
    snap = provenance.snapshot()
    head = subprocess.run(
        ["git", "-C", str(provenance.PACKAGE_ROOT), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    assert snap["commit"] == (head or None)
    assert snap["dirty"] in (True, False, None)
    assert snap["cores"] >= 1 and isinstance(snap["load1"], float)
    assert snap["time"].endswith("Z")


def test_environment_keeps_start_and_adds_end(tmp_path):
    rundir.write_environment(tmp_path, "local", {})
    first = json.loads((tmp_path / "environment.json").read_text())["provenance"]
    assert first["end"] is None and first["start"]["cores"] >= 1
    rundir.write_environment(tmp_path, "local", {})  # the engine's write at the end of its run
    second = json.loads((tmp_path / "environment.json").read_text())["provenance"]
    assert second["start"] == first["start"]
    assert second["end"] is not None and second["end"]["time"] >= first["start"]["time"]


def test_outside_a_checkout_commit_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "PACKAGE_ROOT", tmp_path)
    assert provenance.code_state() == {"commit": None, "dirty": None}
