"""What the guard-rail tests read: NeMo RL trees (the vendored snapshots' files the rules judge
from), the shipped model configs, and a recipe's guard report."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.nemo.driver.guard_rails import model_config
from nemo_fp8_rl.guards.catalogue import guard_context, run_checks
from nemo_fp8_rl.guards.findings import GuardReport
from nemo_fp8_rl.guards.worker_gpu import resolve_worker_gpu

ROOT = Path(__file__).resolve().parents[1]
# the files of a NeMo RL tree the pre-launch rules read
TREE_FILES = (
    "pyproject.toml",
    "nemo_rl/models/generation/vllm/quantization/fp8.py",
    "nemo_rl/models/policy/__init__.py",
    "nemo_rl/algorithms/grpo.py",
    "nemo_rl/weight_sync/ipc_weight_synchronizer.py",
    "nemo_rl/models/generation/vllm/vllm_worker.py",
)
SNAPSHOTS = {"v0.7.0": "nemo-rl-v0.7.0.tar.gz", "7ea279a": "nemo-rl-7ea279a.tar.gz"}


def vendor_dir() -> Path | None:
    """The vendored snapshots (`NEMO_RL_VENDOR`, else `../shared/vendor` of the checkout or of
    its parent folder: a worktree sits one level deeper)."""
    for candidate in (
        os.environ.get("NEMO_RL_VENDOR"),
        ROOT.parent / "shared" / "vendor",
        ROOT.parents[1] / "shared" / "vendor",
    ):
        if candidate and all((Path(candidate) / f).is_file() for f in SNAPSHOTS.values()):
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{snapshot: folder} holding `TREE_FILES` of each vendored NeMo RL snapshot."""
    vendor = vendor_dir()
    if vendor is None:
        pytest.skip("no vendored NeMo RL snapshots (../shared/vendor or NEMO_RL_VENDOR)")
    out = {}
    for name, archive in SNAPSHOTS.items():
        target = tmp_path_factory.mktemp(f"nemo-rl-{name}")
        with tarfile.open(vendor / archive) as tar:
            for rel in TREE_FILES:
                member = tar.getmember(f"nemo-rl/{rel}")
                member.name = rel
                tar.extract(member, target, filter="data")
        out[name] = target
    return out


def report(
    recipe: str,
    overrides: list[str] | tuple[str, ...] = (),
    tree: Path | None = None,
    hf: dict[str, Any] | None = None,
    gpu: str | None = None,
) -> GuardReport:
    """The pre-launch guard report of a shipped recipe with overrides."""
    loaded = load_recipe(recipe, list(overrides))
    hf = hf if hf is not None else model_config(loaded.config["policy"]["model_name"])
    ctx = guard_context(
        loaded, hf, tree, resolve_worker_gpu(loaded.config, gpu, sinfo=lambda p: None)
    )
    return run_checks(ctx, loaded.name)


def only_refused_by(rep: GuardReport, check: str) -> list[str]:
    """The rules of `rep`'s errors, asserting every error comes from `check` (so the doomed
    recipe passes every other check: without its own check nothing would refuse it)."""
    rules = [f.rule for f in rep.errors]
    assert rules, f"nothing refused:\n{rep.render()}"
    assert all(r.split("/")[0] == check for r in rules), rep.render()
    return rules


def shipped_config(model: str) -> dict[str, Any]:
    path = ROOT / "nemo_fp8_rl/engines/nemo/model_configs" / f"{model.replace('/', '--')}.json"
    return json.loads(path.read_text())
