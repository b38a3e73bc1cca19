"""Recorders: stand-ins for the NeMo RL objects that need a Ray cluster or a GPU.

The preflight runs NeMo RL's real driver code (`grpo.setup()` and what `examples/run_grpo.py` does
before it) on a CPU machine. Only what would start Ray actors, claim GPUs or download from the
Hugging Face Hub is replaced, each by a recorder that keeps what it was constructed and called with:

| replaced (module attribute)                           | recorder             | why |
|-------------------------------------------------------|----------------------|-----|
| `grpo.RayVirtualCluster`                              | `ClusterRecorder`    | Ray placement groups of GPUs |
| `grpo.Policy`, `lm_policy.Policy`                     | `PolicyRecorder`     | starts Megatron worker actors |
| `grpo.VllmGeneration`                                 | `GenerationRecorder` | starts vLLM worker actors |
| `grpo.ray`                                            | `RayRecorder`        | `ray.get` on actor futures |
| `grpo.grpo_train`                                     | `TrainRecorder`      | the training loop itself (GPU work) |
| `virtual_cluster.init_ray`                            | `RayRecorder.init`   | connects to / starts a Ray cluster |
| `logger.RayGpuMonitorLogger`                          | `GpuMonitorRecorder` | a Ray actor polling GPUs |
| `data.utils.create_env`                               | `EnvironmentRecorder`| starts the reward environment actor |
| `venvs.create_local_venv_on_each_node`                | `VenvRecorder`       | builds a worker venv on every Ray node |
| `load_dataset` in NeMo RL's dataset modules           | `HubDatasetRecorder` | downloads from the Hub |

Everything else (config handling, tokenizer, data processing, dataloaders, loss, logger,
checkpoint manager, every assertion) is NeMo RL's own code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


class Recorder:
    """Keeps its constructor arguments and every method call made on it (`calls`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.calls: list[tuple[str, tuple, dict]] = []

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def called(self, name: str) -> bool:
        return any(c[0] == name for c in self.calls)


class ClusterRecorder(Recorder):
    """`RayVirtualCluster`: answers the size questions from its own arguments."""

    _sorted_bundle_indices = None
    _nvlink_domain_per_bundle_index = None

    @property
    def num_gpus_per_node(self) -> int:
        return int(self.kwargs.get("num_gpus_per_node") or 0)

    def world_size(self) -> int:
        return int(sum(self.kwargs.get("bundle_ct_per_node_list") or []))

    def get_placement_groups(self) -> list:
        self._record("get_placement_groups")
        return []

    def get_master_address_and_port(self) -> tuple[str, int]:
        self._record("get_master_address_and_port")
        return "127.0.0.1", 0

    def shutdown(self) -> None:
        self._record("shutdown")


class PolicyRecorder(Recorder):
    """`Policy` (Megatron workers): `kwargs["config"]` is the policy config the workers get."""

    def print_node_ip_and_gpu_id(self) -> None:
        self._record("print_node_ip_and_gpu_id")

    def prepare_refit_info(self) -> dict:
        self._record("prepare_refit_info")
        return {}

    def init_collective(self, *args: Any, **kwargs: Any) -> list:
        self._record("init_collective", *args, **kwargs)
        return []

    def shutdown(self) -> None:
        self._record("shutdown")


class GenerationRecorder(Recorder):
    """`VllmGeneration`: `kwargs["config"]` is the generation config the vLLM workers get."""

    @classmethod
    def init_cluster_placement_groups(cls, cluster: Any, config: Any) -> None:
        return None

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        self._record("finish_generation", *args, **kwargs)
        return True

    def prepare_refit_info(self, state_dict_info: Any) -> None:
        self._record("prepare_refit_info", state_dict_info)

    def init_collective(self, *args: Any, **kwargs: Any) -> list:
        self._record("init_collective", *args, **kwargs)
        return []

    def shutdown(self) -> bool:
        self._record("shutdown")
        return True


class RayRecorder(Recorder):
    """The `ray` module as NeMo RL's driver uses it: `get` returns what it is given."""

    def get(self, refs: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("get", refs)
        return refs

    def init(self, *args: Any, **kwargs: Any) -> None:
        self._record("init", *args, **kwargs)


class TrainRecorder(Recorder):
    """`grpo_train`: records the objects the training loop would receive."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._record("grpo_train", *args, **kwargs)


class VenvRecorder(Recorder):
    """`create_local_venv_on_each_node(py_executable, venv_name)`: records, builds nothing."""

    def __call__(self, py_executable: str, venv_name: str) -> str:
        self._record("create_local_venv_on_each_node", py_executable, venv_name)
        return f"<{venv_name} venv NeMo RL builds on each node>/bin/python"


class GpuMonitorRecorder(Recorder):
    """`RayGpuMonitorLogger`."""

    def start(self) -> None:
        self._record("start")

    def stop(self) -> None:
        self._record("stop")


class _RemoteCall:
    """`actor.method` with `.remote()`, as `shutdown_environments` calls it."""

    def __init__(self, owner: Recorder, name: str) -> None:
        self.owner, self.name = owner, name

    def remote(self, *args: Any, **kwargs: Any) -> None:
        self.owner._record(self.name, *args, **kwargs)


class EnvironmentRecorder(Recorder):
    """A reward environment actor (`create_env(env_name, env_config)`).

    Construction checks the environment name against NeMo RL's real `ENV_REGISTRY`, as
    `create_env` does before it starts the actor.
    """

    def __init__(self, env_name: str, env_config: dict) -> None:
        from nemo_rl.environments.utils import ENV_REGISTRY

        assert env_name in ENV_REGISTRY, (
            f"Env name {env_name} is not registered in ENV_REGISTRY (create_env would fail)"
        )
        super().__init__(env_name=env_name, env_config=env_config)
        self.actor_class_fqn = ENV_REGISTRY[env_name]["actor_class_fqn"]
        self.shutdown = _RemoteCall(self, "shutdown")


class HubDatasetRecorder(Recorder):
    """`datasets.load_dataset`: records (repo, split) and returns a small local sample.

    `samples(repo)` gives rows with the columns of the real Hub data set; an unknown repo is a
    FileNotFoundError naming it (the preflight reports it, nothing is downloaded).
    """

    def __init__(self, samples: Callable[[str], list[dict]]) -> None:
        super().__init__()
        self.samples = samples

    def __call__(self, path: str, *args: Any, split: str | None = None, **kwargs: Any) -> Any:
        from datasets import Dataset

        self._record("load_dataset", path, *args, split=split, **kwargs)
        return Dataset.from_list(self.samples(path))


@contextlib.contextmanager
def installed(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set `module.attr = recorder` for each triple; restore every original on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in replacements]
    try:
        for obj, name, value in replacements:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def dataset_modules() -> list[Any]:
    """NeMo RL's dataset modules that bound `datasets.load_dataset` at import."""
    import datasets
    import nemo_rl.data.datasets  # noqa: F401 - imports every dataset class

    return [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("nemo_rl.data.datasets")
        and getattr(module, "load_dataset", None) is datasets.load_dataset
    ]
