"""The shadow worker's interpreter and the PYTHONPATH Ray workers get (`worker_env`).

The contract test runs NeMo RL's real registry lookup, its real per-node environment resolution
(`create_local_venv_on_each_node`, on a real local Ray cluster) and its real worker-group code
(`RayWorkerGroup._create_workers_from_bundle_indices`, with no bundle to start, so no actor is
made); a recorder stands in only for the environment build that code would start. The package
path tests use this checkout and a real wheel of it installed in a fresh virtual environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_nemo_contract import _skip_reason

from nemo_fp8_rl.engines.nemo.driver import runner, worker_env
from nemo_fp8_rl.engines.nemo.driver.worker_env import MEGATRON_WORKER_FQN, WORKER_FQN

REPO = Path(__file__).resolve().parents[1]
skip_without_nemo_rl = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.mark.parametrize(
    "fqn",
    [
        WORKER_FQN,
        worker_env.TRAINER_FP8_WORKER_FQN,
        worker_env.GENERATION_WORKER_FQN,
        worker_env.ASYNC_GENERATION_WORKER_FQN,
    ],
)
def test_worker_class_path_names_a_ray_actor_class(fqn: str) -> None:
    import ast

    module, cls = fqn.rsplit(".", 1)
    source = (REPO / (module.replace(".", "/") + ".py")).read_text()
    remote = [
        n.name
        for n in ast.parse(source).body
        if isinstance(n, ast.ClassDef)
        and any("ray.remote" in ast.unparse(d) for d in n.decorator_list)
    ]
    assert module.startswith("nemo_fp8_rl.engines.nemo.") and cls in remote
    assert runner.WORKER_FQN == WORKER_FQN


# ---- PYTHONPATH for Ray workers ---------------------------------------------------------------


def test_source_checkout_exports_its_root(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    root = worker_env.export_package_path(tmp_path)
    assert root == str(REPO)
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [root, "/somewhere"]
    worker_env.export_package_path(tmp_path)
    assert os.environ["PYTHONPATH"].split(os.pathsep).count(root) == 1
    assert not (tmp_path / worker_env.PATH_DIR).exists()


_EXPORT = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("worker_env", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
first = module.export_package_path(sys.argv[2])
second = module.export_package_path(sys.argv[2])
print(json.dumps({"entry": first, "again": second, "PYTHONPATH": os.environ["PYTHONPATH"]}))
"""


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with this project's wheel installed (no dependencies)."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH (it builds and installs the wheel)")
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(["uv", "build", "--wheel", "-q", "-o", str(tmp), str(REPO)], check=True)
    venv = tmp / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    wheel = next(tmp.glob("nemo_fp8_rl-*.whl"))
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--python",
            str(venv / "bin" / "python"),
            str(wheel),
        ],
        check=True,
    )
    return venv


def test_wheel_install_exports_only_the_package(wheel_venv, tmp_path) -> None:
    python = wheel_venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    installed = Path(site) / "nemo_fp8_rl"
    assert (installed / "engines" / "nemo" / "driver" / "worker_env.py").is_file()
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": "/somewhere"}
    out = subprocess.run(
        [
            str(python),
            "-c",
            _EXPORT,
            str(installed / "engines/nemo/driver/worker_env.py"),
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    )
    result = json.loads(out.stdout)
    entry = Path(result["entry"])
    assert entry == run_dir.resolve() / worker_env.PATH_DIR and result["again"] == result["entry"]
    assert result["PYTHONPATH"].split(os.pathsep) == [str(entry), "/somewhere"]
    assert site not in result["PYTHONPATH"] and "site-packages" not in result["PYTHONPATH"]
    assert os.listdir(entry) == ["nemo_fp8_rl"] and (entry / "nemo_fp8_rl").resolve() == installed
    # A worker's interpreter without the driver's site-packages imports the package from there.
    probe = subprocess.run(
        [str(python), "-S", "-c", "import nemo_fp8_rl; print(nemo_fp8_rl.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(entry)},
        cwd=tmp_path,  # not the checkout: `-c` puts the working directory on sys.path
    )
    assert probe.stdout.strip() == str(entry / "nemo_fp8_rl" / "__init__.py")


def test_a_stale_link_is_replaced(tmp_path) -> None:
    other = tmp_path / "old" / "nemo_fp8_rl"
    other.mkdir(parents=True)
    folder = tmp_path / "run" / worker_env.PATH_DIR
    folder.mkdir(parents=True)
    (folder / "nemo_fp8_rl").symlink_to(other, target_is_directory=True)
    package = worker_env.package_dir()
    assert worker_env._link_folder(tmp_path / "run", package) == folder.resolve()
    assert (folder / "nemo_fp8_rl").resolve() == package


# ---- the shadow worker's interpreter, through NeMo RL's own resolution -------------------------


class RecorderCluster:
    """Recorder for NeMo RL's RayVirtualCluster: no placement group, nothing to place."""

    use_gpus, max_colocated_worker_groups, num_gpus_per_node = False, 1, 0

    def get_master_address_and_port(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def get_placement_groups(self) -> list:
        return []

    def get_available_addresses_and_ports_batch(self, pairs: list) -> list:
        return []


def _worker_group_builds(monkeypatch, fqn: str) -> list[str]:
    """Environments NeMo RL's worker-group code would build for `fqn` (recorder for the build)."""
    from nemo_rl.distributed import worker_groups

    builds: list[str] = []

    def record_build(py_executable: str, venv_name: str) -> str:
        builds.append(venv_name)
        return "/recorded/venv/bin/python"

    monkeypatch.setattr(worker_groups, "create_local_venv_on_each_node", record_build)
    group = worker_groups.RayWorkerGroup.__new__(worker_groups.RayWorkerGroup)
    group.cluster, group.name_prefix = RecorderCluster(), "lm_policy"
    group._workers, group._worker_metadata, group.dp_leader_worker_indices = [], [], []
    builder = worker_groups.RayWorkerBuilder(fqn)
    group._create_workers_from_bundle_indices(builder, [], env_vars={})
    return builds


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A real single-node Ray cluster whose workers see NEMO_RL_VENV_DIR (a fresh folder)."""
    import ray

    venv_dir = tmp_path_factory.mktemp("ray") / "venvs"
    saved = os.environ.get("NEMO_RL_VENV_DIR")
    os.environ["NEMO_RL_VENV_DIR"] = str(venv_dir)  # before ray.init: its workers inherit it
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield venv_dir
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("NEMO_RL_VENV_DIR", None)
        else:
            os.environ["NEMO_RL_VENV_DIR"] = saved


@pytest.mark.nemo_rl
@skip_without_nemo_rl
def test_shadow_worker_uses_the_megatron_workers_environment(local_ray, monkeypatch) -> None:
    from nemo_rl.distributed.ray_actor_environment_registry import (
        ACTOR_ENVIRONMENT_REGISTRY,
        get_actor_python_env,
    )

    megatron_entry = get_actor_python_env(MEGATRON_WORKER_FQN)
    assert megatron_entry.startswith("uv run"), "NeMo RL's own (not system) executable expected"
    # The Megatron environment a container (prefetch_venvs) or an earlier run already built.
    built = local_ray / MEGATRON_WORKER_FQN
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(built)], check=True)
    python = built / "bin" / "python"
    before = sorted(os.listdir(built)), python.lstat().st_mtime_ns

    monkeypatch.delitem(ACTOR_ENVIRONMENT_REGISTRY, WORKER_FQN, raising=False)
    executable = worker_env.register_shadow_worker()

    assert executable == str(python) == get_actor_python_env(WORKER_FQN)
    assert os.listdir(local_ray) == [MEGATRON_WORKER_FQN]  # no environment for the new path
    assert (sorted(os.listdir(built)), python.lstat().st_mtime_ns) == before  # nothing rebuilt
    assert _worker_group_builds(monkeypatch, WORKER_FQN) == []
    # Control: under NeMo RL's `uv run --extra mcore` entry itself, the same worker-group code
    # would build an environment named after the shadow worker on every node.
    monkeypatch.setitem(ACTOR_ENVIRONMENT_REGISTRY, WORKER_FQN, megatron_entry)
    assert _worker_group_builds(monkeypatch, WORKER_FQN) == [WORKER_FQN]


@pytest.mark.nemo_rl
@skip_without_nemo_rl
def test_system_executable_is_used_as_is(local_ray, monkeypatch) -> None:
    """NEMO_RL_PY_EXECUTABLES_SYSTEM=1 registers the driver's Python, and no environment is built.

    (Ray is up only because the worker-group code waits on its, here empty, list of workers.)
    """
    from nemo_rl.distributed.ray_actor_environment_registry import (
        ACTOR_ENVIRONMENT_REGISTRY,
        get_actor_python_env,
    )
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    monkeypatch.setitem(ACTOR_ENVIRONMENT_REGISTRY, MEGATRON_WORKER_FQN, PY_EXECUTABLES.SYSTEM)
    monkeypatch.delitem(ACTOR_ENVIRONMENT_REGISTRY, WORKER_FQN, raising=False)
    assert worker_env.register_shadow_worker() == sys.executable
    assert get_actor_python_env(WORKER_FQN) == sys.executable
    assert _worker_group_builds(monkeypatch, WORKER_FQN) == []
    assert not local_ray.exists() or os.listdir(local_ray) == [MEGATRON_WORKER_FQN]


def test_worker_env_imports_only_the_standard_library() -> None:
    spec = importlib.util.find_spec("nemo_fp8_rl.engines.nemo.driver.worker_env")
    source = Path(spec.origin).read_text()
    tops = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from "))
    }
    assert tops <= {"__future__", "os", "pathlib"}
