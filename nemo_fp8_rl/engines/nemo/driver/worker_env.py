"""Which Python the shadow worker runs in, and how Ray workers import this package.

NeMo RL picks each Ray actor's interpreter by its class path (`ACTOR_ENVIRONMENT_REGISTRY`,
`get_actor_python_env`). A `uv run ...` entry makes the worker group build a virtual
environment *named after the class path* on every node (`create_local_venv_on_each_node`,
under NEMO_RL_VENV_DIR) before the first worker starts. The shadow worker is NeMo RL's
`MegatronPolicyWorker` plus two methods, so it registers under the executable NeMo RL resolves
for that worker: the Megatron environment the container (`prefetch_venvs`) or an earlier run
already built is reused, none is built for the new class path, and an offline cluster works.
Under `NEMO_RL_PY_EXECUTABLES_SYSTEM=1` that executable is the driver's own Python.

Ray workers inherit the driver's PYTHONPATH. For a source checkout its root goes there; for an
installed package (wheel) only the package itself does, through a folder in the run directory
holding one link to it, so the driver's `site-packages` (vLLM, its torch) never shadows the
packages of NeMo RL's worker environments.

This module imports only the standard library at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

MEGATRON_WORKER_FQN = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
WORKER_FQN = "nemo_fp8_rl.engines.nemo.worker.policy_worker.ShadowMegatronPolicyWorker"
TRAINER_FP8_WORKER_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.policy_worker.TrainerFp8MegatronPolicyWorker"
)
VLLM_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
GENERATION_WORKER_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.generation_worker.TrainerFp8VllmGenerationWorker"
)
VLLM_ASYNC_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"
ASYNC_GENERATION_WORKER_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.generation_worker.TrainerFp8VllmAsyncGenerationWorker"
)
CHECKED_GENERATION_WORKER_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.generation_worker.CheckedVllmGenerationWorker"
)
CHECKED_ASYNC_GENERATION_WORKER_FQN = (
    "nemo_fp8_rl.engines.nemo.worker.generation_worker.CheckedVllmAsyncGenerationWorker"
)
PROJECT_NAME = "nemo-fp8-rl"
PATH_DIR = "pythonpath"  # inside the run directory, for an installed package


def nemo_worker_python(nemo_fqn: str = MEGATRON_WORKER_FQN) -> str:
    """The interpreter NeMo RL starts its worker `nemo_fqn` with, resolved as its worker group does.

    A `uv ...` registry entry is turned into NEMO_RL_VENV_DIR/<worker class path>/bin/python
    by NeMo RL's `create_local_venv_on_each_node`, which returns an existing environment as is
    (and builds it only where a plain run would). Needs Ray initialised for that case.
    """
    from nemo_rl.distributed.ray_actor_environment_registry import get_actor_python_env
    from nemo_rl.utils import venvs

    executable = get_actor_python_env(nemo_fqn)
    if executable.startswith("uv"):
        executable = venvs.create_local_venv_on_each_node(
            py_executable=executable, venv_name=nemo_fqn
        )
    return executable


def megatron_worker_python() -> str:
    """The interpreter NeMo RL starts `MegatronPolicyWorker` with."""
    return nemo_worker_python(MEGATRON_WORKER_FQN)


def register_worker(fqn: str = WORKER_FQN, nemo_fqn: str = MEGATRON_WORKER_FQN) -> str:
    """Register the project's worker `fqn` under the interpreter of NeMo RL's `nemo_fqn` (the
    class it extends); returns that path."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    executable = nemo_worker_python(nemo_fqn)
    ACTOR_ENVIRONMENT_REGISTRY[fqn] = executable
    return executable


def register_shadow_worker() -> str:
    """Register the shadow worker under the Megatron worker's interpreter; returns that path."""
    return register_worker(WORKER_FQN, MEGATRON_WORKER_FQN)


def package_dir() -> Path:
    """The `nemo_fp8_rl` folder this module was imported from."""
    return Path(__file__).resolve().parents[3]


def is_source_checkout(package: Path) -> bool:
    """True when `package` sits in this project's source tree (its pyproject.toml beside it)."""
    pyproject = package.parent / "pyproject.toml"
    if not pyproject.is_file():
        return False
    return f'name = "{PROJECT_NAME}"' in pyproject.read_text(encoding="utf-8")


def _link_folder(run_dir: Path, package: Path) -> Path:
    """run_dir/pythonpath holding only a link `nemo_fp8_rl` -> the installed package."""
    folder = Path(run_dir).resolve() / PATH_DIR
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / package.name
    if link.is_symlink() and link.resolve() == package:
        return folder
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(package, target_is_directory=True)
    return folder


def export_package_path(run_dir: Path) -> str:
    """Put what Ray workers need to import this package first on PYTHONPATH; returns the entry.

    Source checkout: the checkout's root. Installed package: run_dir/pythonpath (a link to the
    package only), never the `site-packages` folder that holds it.
    """
    package = package_dir()
    if is_source_checkout(package):
        entry = str(package.parent)
    else:
        entry = str(_link_folder(run_dir, package))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entry not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([entry, *parts])
    return entry
