"""The CPU policy worker (`engines/nemo/cpu/policy_worker.py`) on real megatron-core and NeMo RL.

Built in-process (not through Ray) from a tiny Qwen3 checkpoint made by the embedded engine's
model code, with the policy section of `tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8`:

* `get_logprobs` equals a transformers forward of the same checkpoint (FP32, FP8 off);
* `set_fp8_compute` changes the logprobs (emulated FP8) and back, bit for bit;
* one `train` call with NeMo RL's `ClippedPGLossFn` on a `BatchedDataDict` changes the weights
  and lowers the loss on the same batch; the result has NeMo RL's keys;
* the refit stream goes through NeMo RL's `stream_weights_via_ipc_zmq_impl` over real ZeroMQ
  with the shared-memory handles, and arrives as the checkpoint's HF tensors;
* `save_checkpoint` then a worker built with `weights_path`/`optimizer_path` continues exactly;
* the trainer-side FP8 variant announces and streams (E4M3, scale_inv) pairs.

Needs NeMo RL on PYTHONPATH (`scripts/nemo-rl-contract.sh`) and megatron-core.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

SRC = os.environ.get("NEMO_RL_SRC")
RECIPE = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8"
SEQ = 12
BATCH = 16
VLLM_SIDE = "nemo_rl.models.generation.vllm"


def _skip_reason() -> str | None:
    if not SRC:
        return "NEMO_RL_SRC is not set (run scripts/nemo-rl-contract.sh /path/to/nemo-rl)"
    if sys.version_info < (3, 12):
        return "NeMo RL needs Python >= 3.12 (scripts/nemo-rl-contract.sh builds one)"
    spec = importlib.util.find_spec("nemo_rl")
    if spec is None or not str(spec.origin).startswith(str(Path(SRC).resolve())):
        return f"nemo_rl from {SRC} is not on PYTHONPATH (scripts/nemo-rl-contract.sh sets it)"
    if importlib.util.find_spec("megatron.core") is None:
        return "megatron-core is not installed (scripts/nemo-rl-contract.sh installs it)"
    return None


pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]


@pytest.fixture(scope="module", autouse=True)
def worker_process() -> Any:
    """Leave the test process as found: the workers' process group, model-parallel state,
    CPU shim, IPC handle binding and NeMo RL's vLLM-side modules (imported here without the
    vLLM stand-in other tests install) are process-wide (in a Ray actor, the actor's own)."""
    from nemo_rl.models.policy import utils as policy_utils

    handle = policy_utils.get_handle_from_tensor
    owns_group = not torch.distributed.is_initialized()
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:  # imported here without the vLLM stand-in
        if name.startswith(VLLM_SIDE):
            del sys.modules[name]
    from megatron.core import parallel_state

    from nemo_fp8_rl.engines.nemo.cpu import cuda_shim

    parallel_state.destroy_model_parallel()
    if owns_group and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    cuda_shim.uninstall()
    policy_utils.get_handle_from_tensor = handle


@pytest.fixture(scope="module")
def recipe() -> dict[str, Any]:
    from nemo_fp8_rl.config import load_recipe

    return load_recipe(RECIPE).config


@pytest.fixture(scope="module")
def checkpoint(recipe: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe's tiny Qwen3 (random weights from the recipe seed) as an HF folder."""
    from nemo_fp8_rl.config.project import TinyModelConfig
    from nemo_fp8_rl.tiny.model import build_model, save_checkpoint
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(TinyModelConfig(**recipe["local"]["model"]), tokenizer, seed=3)
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    save_checkpoint(model, tokenizer, folder)
    return folder


def policy_config(recipe: dict[str, Any], checkpoint: Path, **changes: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(recipe["policy"])
    cfg["model_name"] = cfg["tokenizer"]["name"] = str(checkpoint)
    cfg.update(train_global_batch_size=BATCH, train_micro_batch_size=BATCH // 2)  # 2 microbatches
    cfg.update(changes)
    return cfg


def make_worker(cfg: dict[str, Any], cls_name: str = "CpuMegatronPolicyWorkerImpl", **kw: Any):
    from nemo_fp8_rl.engines.nemo.cpu import policy_worker
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    return getattr(policy_worker, cls_name)(cfg, build_tokenizer(), **kw)


@pytest.fixture(scope="module")
def worker(recipe: dict[str, Any], checkpoint: Path) -> Any:
    """The recipe's worker (BF16-emulated compute, FP8 blockwise), LR raised to see a step."""
    cfg = policy_config(recipe, checkpoint)
    cfg["megatron_cfg"]["optimizer"].update(lr=1e-3, min_lr=1e-3)
    return make_worker(cfg)


def token_batch(vocab: int, seed: int = 0) -> Any:
    """Right-padded sequences of ordinary tokens (no pad id: HF zeroes the pad row's grads)."""
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (BATCH, SEQ), generator=gen)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=gen)
    return BatchedDataDict({"input_ids": ids, "input_lengths": lengths})


def hf_logprobs(checkpoint: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()
    with torch.no_grad():
        logits = model(ids).logits
    lp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def test_logprobs_match_transformers_and_fp8_switch(recipe: dict, checkpoint: Path) -> None:
    w = make_worker(
        policy_config(recipe, checkpoint, precision="float32"),
        init_optimizer=False,
        init_reference_model=False,
    )
    data = token_batch(w.hf_config.vocab_size)
    assert w.set_fp8_compute(False) == 1
    off = w.get_logprobs(data=data)["logprobs"]
    assert off.shape == (BATCH, SEQ) and torch.all(off[:, 0] == 0)
    torch.testing.assert_close(off, hf_logprobs(checkpoint, data["input_ids"]), atol=2e-5, rtol=0)
    assert w.set_fp8_compute(True) == 1
    fp8 = w.get_logprobs(data=data)["logprobs"]
    gap = (fp8 - off).abs().max().item()
    assert 1e-3 < gap < 0.5, gap  # emulated E4M3 blocks: visibly different, still close
    w.set_fp8_compute(False)
    assert torch.equal(w.get_logprobs(data=data)["logprobs"], off)


def test_mxfp8_recipe_emulates_te_mxfp8_block_scaling(recipe: dict, checkpoint: Path) -> None:
    """`fp8_recipe: mxfp8`: every decoder linear quantizes weights, activations and gradients in
    1x32 E8M0 blocks (TE's MXFP8BlockScaling); FP8 compute changes the log-probs, and the
    switch brings the BF16 ones back."""
    from nemo_fp8_rl.fp8 import FP8Spec

    cfg = policy_config(recipe, checkpoint, precision="float32")
    cfg["megatron_cfg"]["fp8_cfg"]["fp8_recipe"] = "mxfp8"
    w = make_worker(cfg, init_optimizer=False, init_reference_model=False)
    emulated = [
        m.__dict__["_cpu_emulated"] for m in w.model.modules() if "_cpu_emulated" in m.__dict__
    ]
    mx = FP8Spec.preset("mxfp8")
    assert emulated and all(e.weight_spec == mx and e.act_spec == mx for e in emulated)
    assert all(e.grad_spec == FP8Spec("e4m3", "mxfp8", "e8m0") for e in emulated)
    data = token_batch(w.hf_config.vocab_size)
    w.set_fp8_compute(False)
    off = w.get_logprobs(data=data)["logprobs"]
    w.set_fp8_compute(True)
    gap = (w.get_logprobs(data=data)["logprobs"] - off).abs().max().item()
    assert 1e-4 < gap < 0.5, gap


def train_data(w: Any, seed: int = 1) -> Any:
    data = token_batch(w.hf_config.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed)
    lp = w.get_logprobs(data=data)["logprobs"]
    mask = (torch.arange(SEQ)[None] < data["input_lengths"][:, None]).float()
    mask[:, :3] = 0.0  # the prompt
    data.update(
        advantages=torch.randn(BATCH, 1, generator=gen).expand(BATCH, SEQ).clone(),
        prev_logprobs=lp,
        generation_logprobs=lp,
        reference_policy_logprobs=lp,
        token_mask=mask,
        sample_mask=torch.ones(BATCH),
    )
    return data


def clipped_pg(recipe: dict) -> Any:
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn

    cfg = {k: v for k, v in recipe["loss_fn"].items() if k != "calibration"}
    return ClippedPGLossFn(ClippedPGLossConfig(**cfg))


def test_train_step_with_clipped_pg(worker: Any, recipe: dict) -> None:
    data = train_data(worker)
    loss_fn = clipped_pg(recipe)
    before = {k: v.clone() for k, v in worker.model.module.state_dict().items() if "weight" in k}
    first = worker.train(data, loss_fn)
    assert {"global_loss", "grad_norm", "all_mb_metrics", "model_dtype", "gpu_name"} <= set(first)
    metrics = first["all_mb_metrics"]
    assert metrics["lr"] == [pytest.approx(1e-3)] * 2 and "probs_ratio" in metrics
    assert metrics["global_valid_toks"] == [float(data["token_mask"][:, 1:].sum())] * 2
    assert float(first["grad_norm"][0]) > 0
    after = worker.model.module.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    second = worker.train(data, loss_fn)
    assert float(second["global_loss"][0]) < float(first["global_loss"][0])


def test_kv_scales_calibration(worker: Any) -> None:
    from nemo_rl.models.generation.vllm.quantization.fp8_train_utils import (
        get_vllm_qkv_scale_names,
    )

    data = token_batch(worker.hf_config.vocab_size, seed=4)
    got = worker.calibrate_qkv_fp8_scales(data=data, include_q=True)
    names = [n for i in range(2) for n in get_vllm_qkv_scale_names(i).values()]
    assert got["format"] == "fp8" and sorted(got["layers"]) == sorted(names)
    assert all(0.0 < v < 1.0 for v in got["layers"].values())  # amax / 448 of a tiny model
    wider = worker.calibrate_qkv_fp8_scales(data=data, include_q=True, margin=2.0)
    for name, value in got["layers"].items():
        assert wider["layers"][name] == pytest.approx(value * 2.0 / 1.05)


def test_lr_schedule_hold(worker: Any) -> None:
    ticks = worker.scheduler.num_steps
    assert worker.hold_lr_schedule(True)
    worker.scheduler.step(increment=16)
    assert worker.scheduler.num_steps == ticks
    assert worker.hold_lr_schedule(False)
    worker.scheduler.step(increment=16)
    assert worker.scheduler.num_steps == ticks + 16


def receive(address: str, info: dict, out: list, errors: list) -> None:
    """NeMo RL's receiver protocol (REP socket, aligned slices, ACK per batch, COMPLETE)."""
    import zmq
    from nemo_rl.models.policy.utils import IPCProtocol, calculate_aligned_size

    from nemo_fp8_rl.engines.nemo.cpu import ipc

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.RCVTIMEO, 120_000)
    sock.connect(address)
    try:
        while (payload := sock.recv_pyobj()) != IPCProtocol.COMPLETE:
            handle, names, used = payload
            buffer, offset = ipc.rebuild_from_handle(handle), 0
            for name in names:
                shape, dtype = info[name]
                size = dtype.itemsize * torch.Size(shape).numel()
                out.append((name, buffer[offset : offset + size].view(dtype).view(shape).clone()))
                offset += calculate_aligned_size(size)
            assert offset == used
            sock.send(IPCProtocol.ACK.value.encode())
        sock.send(IPCProtocol.ACK.value.encode())
    except BaseException as exc:  # reported by the caller
        errors.append(exc)
    finally:
        sock.close(linger=0)
        ctx.term()


def stream(w: Any, info: dict, buffer_bytes: int) -> list[tuple[str, torch.Tensor]]:
    out: list = []
    errors: list = []
    thread = threading.Thread(target=receive, args=(w.get_zmq_address(), info, out, errors))
    w.maybe_init_zmq()  # bind before the receiver connects
    thread.start()
    w.stream_weights_via_ipc_zmq(buffer_size_bytes=buffer_bytes)
    thread.join(timeout=600)  # a hang, not a loaded machine
    assert not errors, errors
    return out


def test_refit_stream_round_trip(recipe: dict, checkpoint: Path) -> None:
    from safetensors.torch import load_file

    w = make_worker(policy_config(recipe, checkpoint), init_optimizer=False)
    info = w.prepare_refit_info()
    try:
        got = stream(w, info, buffer_bytes=2 * 96 * 1024)  # several chunks
    finally:
        w.shutdown()
    assert [n for n, _ in got] == list(info)
    saved = load_file(str(next(checkpoint.glob("*.safetensors"))))
    assert set(info) == set(saved) - {"lm_head.weight"}  # tied: the embedding travels once
    for name, tensor in got:
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, saved[name].to(torch.bfloat16)), name
    assert w.report_device_id().startswith("CPU-") and w.get_free_memory_bytes() > 0


def test_trainer_fp8_refit_pairs(recipe: dict, checkpoint: Path) -> None:
    w = make_worker(
        policy_config(recipe, checkpoint),
        "CpuTrainerFp8MegatronPolicyWorkerImpl",
        init_optimizer=False,
        init_reference_model=False,
    )
    info = w.prepare_refit_info()
    name = "model.layers.0.mlp.gate_proj.weight"
    assert info[name][1] == torch.float8_e4m3fn
    assert info[name + "_scale_inv"][1] == torch.float32
    try:
        got = dict(stream(w, info, buffer_bytes=2 * 96 * 1024))
    finally:
        w.shutdown()
    assert set(got) == set(info) and got[name].dtype == torch.float8_e4m3fn


def test_checkpoint_resume(worker: Any, recipe: dict, checkpoint: Path, tmp_path: Path) -> None:
    data = train_data(worker, seed=2)
    loss_fn = clipped_pg(recipe)
    worker.train(data, loss_fn)
    weights, optim = tmp_path / "policy" / "weights", tmp_path / "policy" / "optimizer"
    worker.save_checkpoint(weights_path=str(weights), optimizer_path=str(optim))
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    cfg = policy_config(recipe, checkpoint)
    cfg["megatron_cfg"]["optimizer"].update(lr=1e-3, min_lr=1e-3)
    resumed = make_worker(cfg, weights_path=str(weights), optimizer_path=str(optim))
    assert torch.equal(
        resumed.get_logprobs(data=data)["logprobs"], worker.get_logprobs(data=data)["logprobs"]
    )
    a, b = worker.train(data, loss_fn), resumed.train(data, loss_fn)
    assert torch.equal(a["global_loss"], b["global_loss"])
    assert torch.equal(a["grad_norm"], b["grad_norm"])
    assert torch.equal(
        worker.get_logprobs(data=data)["logprobs"], resumed.get_logprobs(data=data)["logprobs"]
    )
