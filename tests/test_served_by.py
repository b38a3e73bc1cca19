"""What `environment.json` records about what served a NeMo RL run, so that `compare` can tell
two runs' generators and NeMo RL trees apart (`engines.nemo.driver.served_by`,
`engines.nemo.cpu.vllm_choice.served_record`)."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import served_record
from nemo_fp8_rl.engines.nemo.driver.served_by import tree_revision

VENDOR = Path(__file__).resolve().parents[1].parent / "shared" / "vendor"


def _package(root: Path, text: str) -> Path:
    package = root / "nemo-rl" / "nemo_rl"
    (package / "algorithms").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.7.0'\n")
    (package / "algorithms" / "grpo.py").write_text(text)
    return package


def test_the_tree_digest_follows_the_source_and_a_checkout_gives_its_commit(tmp_path):
    a = tree_revision(_package(tmp_path / "a", "x = 1\n"))
    same = tree_revision(_package(tmp_path / "b", "x = 1\n"))
    other = tree_revision(_package(tmp_path / "c", "x = 2\n"))
    assert a["commit"] is None and len(a["source_sha256"]) == 64  # an unpacked archive
    assert a["source_sha256"] == same["source_sha256"] != other["source_sha256"]
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the commit of a checkout cannot be read")
    tree = tmp_path / "c" / "nemo-rl"
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
    assert tree_revision(tree / "nemo_rl")["commit"] == head.stdout.strip()
    assert tree_revision(None) == {"commit": None, "source_sha256": None}


@pytest.mark.skipif(not VENDOR.is_dir(), reason="the vendored NeMo RL archives are not here")
def test_the_two_vendored_trees_differ(tmp_path):
    digests = []
    for name in ("nemo-rl-v0.7.0.tar.gz", "nemo-rl-7ea279a.tar.gz"):
        with tarfile.open(VENDOR / name) as tar:
            members = [m for m in tar.getmembers() if "/nemo_rl/" in m.name and m.isfile()]
            tar.extractall(tmp_path / name, members=members, filter="data")
        digests.append(tree_revision(tmp_path / name / "nemo-rl" / "nemo_rl")["source_sha256"])
    assert None not in digests and digests[0] != digests[1]


def test_the_generator_record_names_the_backend_and_why():
    stand_in = served_record(False, "the stand-in generation worker: no AMX", "cpu")
    assert stand_in == {
        "backend": "stand-in",
        "version": None,
        "build": "cpu",
        "reason": "the stand-in generation worker: no AMX",
    }
    real = served_record(True, "NeMo RL's vLLM worker", "gpu")
    assert real["backend"] == "vllm" and real["build"] == "gpu"
