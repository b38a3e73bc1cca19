"""Contract (slow): NeMo RL's real `VllmGeneration` builds the CPU generation worker on Ray.

A local Ray with one logical GPU; NeMo RL's `RayVirtualCluster(use_gpus=True)` places one
bundle; `VllmGeneration` (inside `cpu_generation_worker()`) builds the worker through
`RayWorkerBuilder`/`RayWorkerGroup`, and a second actor on the same bundle plays the policy
worker: it reports the device id by the same rule and streams a refit with NeMo RL's
`stream_weights_via_ipc_zmq_impl` to the socket that id names. About 1 minute on a quiet
2-core machine (Ray start, two actor processes importing torch and NeMo RL); `-m slow`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.slow,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


class PolicyStandIn:
    """The colocated policy worker's refit side: its device id and NeMo RL's sender."""

    def __init__(self) -> None:
        from nemo_fp8_rl.engines.nemo.cpu import device, ipc

        ipc.install()
        self.uuid = device.device_uuid()

    def device_id(self) -> str:
        return self.uuid

    def stream(self, export: list[tuple[str, torch.Tensor]]) -> bool:
        import types

        import zmq
        from nemo_rl.models.policy import utils as policy_utils

        fence = types.SimpleNamespace(synchronize=lambda: None)  # CPU copies are synchronous
        torch.cuda.current_stream = lambda *a, **k: fence
        context = zmq.Context()
        sender = context.socket(zmq.REQ)
        sender.setsockopt(zmq.RCVTIMEO, 120_000)
        sender.setsockopt(zmq.LINGER, 0)
        sender.bind(f"ipc:///tmp/{self.uuid}.sock")  # NeMo RL's policy-side address
        try:
            policy_utils.stream_weights_via_ipc_zmq_impl(
                params_generator=iter(export),
                buffer_size_bytes=400 * 1024,
                zmq_socket=sender,
                rank=0,
                worker_name="policy",
            )
        finally:
            sender.close()
            context.term()
        return True


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_nemo_cpu_generation_worker import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    keep = ("PYTHONPATH", "NEMO_RL_SRC", "OMP_NUM_THREADS")
    os.environ["NEMO_RL_PY_EXECUTABLES_SYSTEM"] = "1"
    env = {k: os.environ[k] for k in (*keep, "NEMO_RL_PY_EXECUTABLES_SYSTEM") if k in os.environ}
    here = str(Path(__file__).parent)  # the policy stand-in's module, for the actors to import
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env})
    yield ray
    ray.shutdown()


def test_vllm_generation_serves_and_refits_on_ray(ray_cluster: Any, checkpoint: Path) -> None:
    import ray
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES, RayVirtualCluster
    from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from test_nemo_cpu_generation_worker import gen_config, metadata, policy_export

    from nemo_fp8_rl.engines.nemo.cpu import generation_worker as gw
    from nemo_fp8_rl.engines.nemo.cpu import worker_choice

    cfg = gen_config(checkpoint, precision="fp8")
    ACTOR_ENVIRONMENT_REGISTRY[gw.GENERATOR_WORKER_FQN] = PY_EXECUTABLES.SYSTEM
    cluster = RayVirtualCluster(
        [1], use_gpus=True, max_colocated_worker_groups=2, num_gpus_per_node=1, name="cpugen"
    )
    with worker_choice.cpu_generation_worker("generator"):
        generation = VllmGeneration(cluster, copy.deepcopy(cfg))
    try:
        pg = cluster.get_placement_groups()[0]
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=0
        )
        policy = (
            ray.remote(num_gpus=0.5)(PolicyStandIn).options(scheduling_strategy=strategy).remote()
        )
        assert generation.device_uuids == [[ray.get(policy.device_id.remote())]]

        ids = torch.tensor([[1, 4, 5, 13, 6, 7, 16], [1, 10, 15, 11, 16, 0, 0]])
        data = BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([7, 5])})
        generation.finish_generation()
        assert generation.prepare_for_generation()
        before = generation.generate(data, greedy=True)
        assert before["output_ids"].shape[0] == 2

        export = policy_export(checkpoint)
        generation.prepare_refit_info(metadata(export))
        generation.finish_generation()
        generation.prepare_for_generation(tags=["weights"])
        sent = policy.stream.remote(export)
        received = generation.update_weights_via_ipc_zmq()
        assert ray.get(sent) and ray.get(received) == [True]
        generation.prepare_for_generation(tags=["kv_cache"])
        after = generation.generate(data, greedy=True)
        assert not torch.equal(after["output_ids"], before["output_ids"])

        bad = metadata(export)
        bad.pop("model.norm.weight")
        with pytest.raises(ray.exceptions.RayTaskError, match="model.norm.weight"):
            generation.prepare_refit_info(bad)
    finally:
        generation.shutdown()
        cluster.shutdown()
