"""The CPU generation worker's refit (NeMo RL's receiving code over ZeroMQ, both
`quantize_on` modes, all-or-nothing), and which worker NeMo RL's `VllmGeneration` picks.

The worker, its fixtures and the refit helpers are in `test_nemo_cpu_generation_worker`.
"""

# ruff: noqa: F811  (the fixtures `nemo` and `checkpoint` are imported from that module)

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason
from test_nemo_cpu_generation_worker import (  # noqa: F401 (fixtures)
    LAYERS,
    checkpoint,
    cpu_ipc,
    forward_logprobs,
    gen_config,
    make_worker,
    metadata,
    nemo,
    policy_export,
    prompts,
    refit,
    same_state,
    served_state,
)

from nemo_fp8_rl.refit.errors import RefitMismatch

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


def test_generator_side_refit_over_zmq_changes_the_served_weights(
    nemo: Any, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = make_worker(nemo, gen_config(checkpoint, precision="fp8"))
    data = prompts(nemo, checkpoint)
    before_out = worker.generate(data, greedy=True)
    before = torch.cat(forward_logprobs(worker.model, before_out))
    stream = policy_export(checkpoint)
    worker.sleep()
    worker.wake_up(tags=["weights"])  # grpo's refit order
    worker.prepare_refit_info(metadata(stream))
    with cpu_ipc(nemo, monkeypatch):
        assert refit(nemo, worker, stream)
    worker.wake_up(tags=["kv_cache"])
    q = worker.model.model.layers[2].mlp.down_proj
    sent = dict(stream)["model.layers.2.mlp.down_proj.weight"].float()
    with worker.fp8.globals():
        w, s = nemo.fp8.cast_tensor_to_fp8_blockwise(sent, weight_block_size=[128, 128])
    assert torch.equal(q.weight.view(torch.uint8), w.view(torch.uint8))  # NeMo RL's quantization
    assert torch.equal(q.weight_scale_inv, s.squeeze(-1))
    norm = worker.model.model.norm.weight
    assert torch.equal(norm, dict(stream)["model.norm.weight"].float())
    after = torch.cat(forward_logprobs(worker.model, before_out))
    assert (after - before).abs().max() > 1e-2


def test_trainer_side_refit_loads_the_fp8_pairs_as_sent(
    nemo: Any, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_fp8_rl.engines.nemo.worker.trainer_refit import (
        plan_layout,
        quantized_stream,
        rules_for_worker,
        shape_only,
    )

    cfg = gen_config(checkpoint, precision="fp8")
    worker = make_worker(nemo, cfg, trainer=True)
    export = policy_export(checkpoint, seed=2)
    layout, entries = plan_layout(export, rules_for_worker({"generation": cfg}, LAYERS))
    info = {n: (t.shape, t.dtype) for n, t in shape_only(entries)}
    stream = list(quantized_stream(export, layout))
    assert info == metadata(stream)
    worker.prepare_refit_info(info)
    with cpu_ipc(nemo, monkeypatch):
        assert refit(nemo, worker, stream)
    held = served_state(worker)
    for name, tensor in stream:
        if tensor.dtype == torch.float8_e4m3fn or name.endswith("_scale_inv"):
            assert torch.equal(held[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_mismatched_refit_metadata_is_refused_before_any_weight_moves(
    nemo: Any, checkpoint: Path
) -> None:
    worker = make_worker(nemo, gen_config(checkpoint, precision="fp8"))
    before = served_state(worker)
    stream = policy_export(checkpoint)
    bad = metadata(stream)
    bad["model.layers.1.mlp.up_proj.weight"] = (torch.Size([321, 192]), torch.bfloat16)
    bad.pop("model.norm.weight")
    with pytest.raises(RefitMismatch, match="no weight was loaded") as err:
        worker.prepare_refit_info(bad)
    assert "model.layers.1.mlp.up_proj.weight: shape [321, 192]" in str(err.value)
    assert "model.norm.weight: the served model holds it" in str(err.value)
    assert not hasattr(worker.extension, "state_dict_info")
    assert same_state(before, served_state(worker))
    import pickle  # Ray pickles a worker's exception to raise it in the driver

    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


def test_stream_that_breaks_midway_commits_nothing(
    nemo: Any, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata matches; the stream's last tensors do not (a BF16 tensor where the
    metadata says FP32): NeMo RL's receiver fails that chunk after loading earlier ones, and
    the served weights stay as they were. 7ea279a's receiver still answers the sender (which
    then completes); v0.7.0's stops answering, so its sender times out (shortened here)."""
    worker = make_worker(nemo, gen_config(checkpoint, precision="fp8"))
    before = served_state(worker)
    stream = policy_export(checkpoint)
    info = metadata(stream)
    last = stream[-1][0]
    info[last] = (info[last][0], torch.float32)
    worker.prepare_refit_info(info)
    answers = hasattr(nemo.backend, "_IPCWeightManifest")  # 7ea279a's receiver
    errors: list[BaseException] = []
    with cpu_ipc(nemo, monkeypatch):
        assert not refit(
            nemo, worker, stream, timeout_ms=120_000 if answers else 15_000, errors=errors
        )
    assert not errors if answers else [type(e) for e in errors] == [TimeoutError]
    assert same_state(before, served_state(worker))
    assert not worker.model.staged_names()


def test_refit_while_asleep_is_refused(nemo: Any, checkpoint: Path) -> None:
    worker = make_worker(nemo, gen_config(checkpoint))
    worker.sleep()
    with pytest.raises(nemo.gw.CpuGenerationError, match="prepare_for_generation"):
        worker.update_weights_via_ipc_zmq()
    with pytest.raises(nemo.gw.CpuGenerationError, match="asleep"):
        worker.generate(prompts(nemo, checkpoint))


# ---- selection and device id ---------------------------------------------------------------


def test_vllm_generation_picks_the_cpu_worker_inside_the_block(nemo: Any) -> None:
    module = nemo.vllm_generation
    original = module.resolve_generation_worker_cls
    cfg = {"vllm_cfg": {"async_engine": False}}
    with nemo.choice.cpu_generation_worker("trainer") as fqn:
        assert module.resolve_generation_worker_cls(nemo.gw.SYNC_VLLM_WORKER_FQN, cfg) == fqn
        assert fqn == nemo.gw.TRAINER_WORKER_FQN
        async_cfg = {"vllm_cfg": {"async_engine": True}}
        chosen = module.resolve_generation_worker_cls(
            nemo.choice.agw.ASYNC_VLLM_WORKER_FQN, async_cfg
        )
        assert chosen == nemo.choice.agw.TRAINER_WORKER_FQN
    assert module.resolve_generation_worker_cls is original
    with nemo.choice.cpu_generation_worker() as fqn, pytest.raises(nemo.gw.CpuGenerationError):
        module.resolve_generation_worker_cls("some.other.Worker", cfg)
    assert fqn == nemo.gw.GENERATOR_WORKER_FQN


def test_device_id_rule() -> None:
    import os

    from nemo_fp8_rl.engines.nemo.cpu.device import device_uuid, device_uuid_for

    assert device_uuid_for("ab12", 3) == "CPU-ab12-GPU3"
    assert device_uuid() == f"CPU-local-{os.getpid()}"
