"""Contract: `refit.quantize_on: trainer` through NeMo RL's real vLLM-side loading and packing code.

Runs against a NeMo RL tree (`scripts/nemo-rl-contract.sh /path/to/nemo-rl`). vLLM itself is
replaced by the named stand-ins of `nemo_vllm_stand_in` (layer classes, engine classes, the
post-load step); the vLLM model is a `RecordingModel` whose `load_weights` records its calls.
NeMo RL's own `fp8.load_weights` (the `generator` path), `VllmInternalWorkerExtension`
(`_load_weights`, `update_weights_via_ipc_zmq`, `update_weights_from_collective`),
`stream_weights_via_ipc_zmq_impl` and `packed_broadcast_producer`/`consumer` run as shipped;
their CUDA calls (IPC handles, streams, device buffers) have CPU stand-ins named below.
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 200, 300, 4, 2, 64, 260
LAYERS = 3
VLLM_CFG = {"precision": "fp8", "quantization_ignored_layer_kws": ["layers.0."]}  # layer 0 BF16
FP8_LAYERS = [False, True, True]  # as vLLM builds it with that keyword


def bf16_export(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """What NeMo RL's Megatron export yields for a 3-layer Qwen3 (HF names, BF16), then a
    draft-model weight and an FP8 KV-cache scale as the worker appends them."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    out = [("model.embed_tokens.weight", w(VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", w(HIDDEN)),
            (f"{p}.self_attn.q_proj.weight", w(HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.k_proj.weight", w(KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.v_proj.weight", w(KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.o_proj.weight", w(HIDDEN, HEADS * HEAD_DIM)),
            (f"{p}.self_attn.q_norm.weight", w(HEAD_DIM)),
            (f"{p}.self_attn.k_norm.weight", w(HEAD_DIM)),
            (f"{p}.post_attention_layernorm.weight", w(HIDDEN)),
            (f"{p}.mlp.gate_proj.weight", w(INTER, HIDDEN)),
            (f"{p}.mlp.up_proj.weight", w(INTER, HIDDEN)),
            (f"{p}.mlp.down_proj.weight", w(HIDDEN, INTER)),
        ]
    out += [("model.norm.weight", w(HIDDEN)), ("lm_head.weight", w(VOCAB, HIDDEN))]
    out += [("draft.model.fc.weight", w(HIDDEN, 2 * HIDDEN))]
    out += [("model.layers.1.self_attn.k_scale", torch.tensor([0.5]))]
    return out


@pytest.fixture(scope="module")
def nemo() -> Any:
    """NeMo RL's vLLM-side modules (and the project's extension) imported against the stand-ins."""
    import nemo_vllm_stand_in as stand_in

    if stand_in.vllm_installed():
        pytest.skip("vLLM is installed here: these tests drive NeMo RL with vLLM stand-ins")
    with stand_in.installed_vllm_stand_in() as after_loading:
        from nemo_rl.models.generation.vllm import vllm_backend
        from nemo_rl.models.generation.vllm.quantization import fp8
        from nemo_rl.models.policy import utils as policy_utils
        from nemo_rl.utils import packed_tensor

        from nemo_fp8_rl.engines.nemo.worker import vllm_extension

        yield types.SimpleNamespace(
            fp8=fp8,
            backend=vllm_backend,
            policy_utils=policy_utils,
            packed=packed_tensor,
            ext=vllm_extension,
            stand_in=stand_in,
            after_loading=after_loading,
        )


@pytest.fixture(autouse=True)
def fresh_fp8_state(nemo: Any) -> None:
    """NeMo RL's FP8 module globals as `init_fp8` leaves them for this config (no pow2)."""
    nemo.fp8.global_fp8_config = nemo.fp8.FP8Config(model_parallel_size=1)
    nemo.fp8.fp8_state = nemo.fp8.FP8State()


def trainer_plan(
    export: list[tuple[str, torch.Tensor]], pow2: bool = False, cfg: dict = VLLM_CFG
) -> tuple[Any, dict]:
    """The worker's metadata step (as `QuantizeOnTrainer.prepare_refit_info` runs it): the
    layout, and `{name: (shape, dtype)}` as planned."""
    from nemo_fp8_rl.engines.nemo.worker.trainer_refit import (
        plan_layout,
        rules_for_worker,
        shape_only,
    )

    worker_cfg = {"generation": {"vllm_cfg": {**cfg, "pow2_weight_scaling_factors": pow2}}}
    layout, entries = plan_layout(export, rules_for_worker(worker_cfg, LAYERS))
    return layout, {n: (t.shape, t.dtype) for n, t in shape_only(entries)}


def trainer_stream(
    export: list[tuple[str, torch.Tensor]], pow2: bool = False, cfg: dict = VLLM_CFG
) -> list[tuple[str, torch.Tensor]]:
    """The worker's refit stream: the export with the FP8 weights quantized."""
    from nemo_fp8_rl.engines.nemo.worker.trainer_refit import quantized_stream

    return list(quantized_stream(export, trainer_plan(export, pow2, cfg)[0]))


def metadata(stream: list[tuple[str, torch.Tensor]]) -> dict:
    return {n: (t.shape, t.dtype) for n, t in stream}


def extension(nemo: Any, model: Any) -> Any:
    """The project's extension as vLLM builds it: NeMo RL's base class, a model runner."""
    ext = nemo.ext.TrainerFp8WorkerExtension.__new__(nemo.ext.TrainerFp8WorkerExtension)
    ext.model_runner = nemo.stand_in.StandInModelRunner(model)
    ext.model_config = ext.model_runner.vllm_config.model_config
    ext.device = torch.device("cpu")
    return ext


def generator_calls(
    nemo: Any, export: list[tuple[str, torch.Tensor]], moe: bool = False
) -> list[list]:
    """NeMo RL's own path: its `fp8.load_weights` quantizes the BF16 policy weights."""
    model = nemo.stand_in.RecordingModel(FP8_LAYERS, moe)
    runner = nemo.stand_in.StandInModelRunner(model)
    policy = [(n, t) for n, t in export if not n.startswith("draft.")]
    nemo.fp8.load_weights(policy, runner)
    return model.calls


def same(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> None:
    """Equal names, dtypes, shapes and bytes, in order."""
    assert [n for n, _ in a] == [n for n, _ in b]
    for (name, x), (_, y) in zip(a, b, strict=True):
        assert (x.dtype, x.shape) == (y.dtype, y.shape), name
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), name


@pytest.mark.parametrize("pow2", [False, True])
def test_load_weights_receives_the_same_pairs_both_ways(nemo: Any, pow2: bool) -> None:
    export = bf16_export()
    nemo.fp8.global_fp8_config = nemo.fp8.FP8Config(
        model_parallel_size=1, use_weight_pow2_scale=pow2
    )
    generator = generator_calls(nemo, export)
    model = nemo.stand_in.RecordingModel(FP8_LAYERS)
    ext = extension(nemo, model)
    stream = trainer_stream(export, pow2)
    planned = trainer_plan(export, pow2)[1]
    assert planned == metadata(stream)  # the metadata step describes what is sent
    nemo.fp8.fp8_state = nemo.fp8.FP8State()
    ext.prepare_refit_info(planned)
    ext._load_weights(list(stream))  # NeMo RL's loading path, FP8 step replaced for the call
    assert len(generator) == len(model.calls) == 1
    same(model.calls[0], generator[0])
    fp8_names = [n for n, t in model.calls[0] if t.dtype == torch.float8_e4m3fn]
    assert len(fp8_names) == 7 * 2  # layers 1 and 2 (layer 0 stays BF16)
    assert nemo.fp8.load_weights.__module__ == nemo.fp8.__name__  # restored after the call


def moe_export(seed: int = 2) -> list[tuple[str, torch.Tensor]]:
    """A Qwen3-MoE export as 7ea279a's Megatron worker streams it: router and grouped expert
    slabs `mlp.experts.gate_up_proj` [E, 2I, H] / `mlp.experts.down_proj` [E, H, I]."""
    g = torch.Generator().manual_seed(seed)
    experts, inter, hidden = 2, 128, 256

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    out = []
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.self_attn.q_proj.weight", w(HEADS * HEAD_DIM, hidden)),
            (f"{p}.mlp.gate.weight", w(experts, hidden)),
            (f"{p}.mlp.experts.gate_up_proj", w(experts, 2 * inter, hidden)),
            (f"{p}.mlp.experts.down_proj", w(experts, hidden, inter)),
        ]
    return out


def test_grouped_moe_experts_reach_load_weights_the_same_both_ways(nemo: Any) -> None:
    """7ea279a expands FP8 experts' grouped slabs per expert on the vLLM side, v0.7.0 passes them
    on in BF16; the trainer side does what the NeMo RL in use does, and the lists agree."""
    export = moe_export()
    generator = generator_calls(nemo, export, moe=True)
    model = nemo.stand_in.RecordingModel(FP8_LAYERS, moe=True)
    ext = extension(nemo, model)
    stream = trainer_stream(export)
    assert trainer_plan(export)[1] == metadata(stream)
    nemo.fp8.fp8_state = nemo.fp8.FP8State()
    ext.prepare_refit_info(metadata(stream))
    ext._load_weights(list(stream))
    same(model.calls[0], generator[0])
    expanded = hasattr(nemo.fp8, "_expand_grouped_moe_expert_to_fp8")
    names = [n for n, _ in model.calls[0]]
    assert ("model.layers.1.mlp.experts.1.up_proj.weight_scale_inv" in names) == expanded
    assert ("model.layers.1.mlp.experts.gate_up_proj" in names) == (not expanded)
    assert "model.layers.0.mlp.experts.gate_up_proj" in names  # layer 0 is BF16: never expanded


def payload_variants(stream: list[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """Bad payloads: each differs from the good one in one tensor."""
    q = "model.layers.1.self_attn.q_proj.weight"
    s = q + "_scale_inv"
    bf16 = dict(bf16_export())

    def swap(name: str, tensor: torch.Tensor | None) -> list:
        return [
            (n, tensor if n == name else t) for n, t in stream if n != name or tensor is not None
        ]

    return {
        "BF16 weight where vLLM holds FP8": swap(q, bf16[q]),
        "missing scale": swap(s, None),
        "misshapen scale": swap(s, torch.ones(1, 1)),
        "unexpected scale name": stream + [("model.norm.weight_scale_inv", torch.ones(2, 2))],
        "FP8 where vLLM holds BF16": swap(
            "model.layers.0.mlp.down_proj.weight",
            bf16["model.layers.0.mlp.down_proj.weight"].to(torch.float8_e4m3fn),
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "BF16 weight where vLLM holds FP8",
        "missing scale",
        "misshapen scale",
        "unexpected scale name",
        "FP8 where vLLM holds BF16",
    ],
)
def test_mismatched_payload_leaves_the_model_untouched(nemo: Any, case: str) -> None:
    from nemo_fp8_rl.refit.errors import RefitMismatch

    bad = payload_variants(trainer_stream(bf16_export()))[case]
    model = nemo.stand_in.RecordingModel(FP8_LAYERS)
    ext = extension(nemo, model)
    with pytest.raises(RefitMismatch, match="no weight was loaded"):
        ext.prepare_refit_info(metadata(bad))
    assert model.calls == []
    assert not hasattr(ext, "state_dict_info")


def test_chunk_that_differs_from_the_metadata_is_refused_before_loading(nemo: Any) -> None:
    from nemo_fp8_rl.refit.errors import RefitMismatch

    stream = trainer_stream(bf16_export())
    model = nemo.stand_in.RecordingModel(FP8_LAYERS)
    ext = extension(nemo, model)
    ext.prepare_refit_info(metadata(stream))
    q = "model.layers.2.mlp.up_proj.weight"
    chunk = [(n, t.to(torch.bfloat16) if n == q else t) for n, t in stream]
    with pytest.raises(RefitMismatch, match=q):
        ext._load_weights(chunk)
    assert model.calls == []


def test_bf16_vllm_refuses_the_fp8_metadata(nemo: Any) -> None:
    from nemo_fp8_rl.refit.errors import RefitMismatch

    stream = trainer_stream(bf16_export())
    ext = extension(nemo, nemo.stand_in.RecordingModel(FP8_LAYERS))
    ext.model_runner = nemo.stand_in.StandInModelRunner(ext.model_runner.model, fp8=False)
    with pytest.raises(RefitMismatch, match="without FP8 weights"):
        ext.prepare_refit_info(metadata(stream))


# ---- transports ---------------------------------------------------------------------------


class InProcessIpcHandles:
    """CUDA IPC stand-in: a 'handle' names a buffer kept in this process (sender and receiver
    share it, as two processes share a CUDA allocation)."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}

    def handle(self, tensor: torch.Tensor) -> tuple[int]:
        self.buffers[id(tensor)] = tensor
        return (id(tensor),)

    def rebuild(self, handle: tuple[int], device_index: Any) -> torch.Tensor:
        return self.buffers[handle[0]]


class CpuStream:
    """`torch.cuda.Stream` / `current_stream()` stand-in: CPU work is already synchronous."""

    def synchronize(self) -> None:
        return None


@contextlib.contextmanager
def cpu_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: CpuStream())
    yield


def received(ext_model: Any) -> list[tuple[str, torch.Tensor]]:
    return [item for call in ext_model.calls for item in call]


def test_ipc_zmq_round_trip(nemo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Trainer: NeMo RL's `stream_weights_via_ipc_zmq_impl` over the quantized stream; vLLM:
    NeMo RL's `update_weights_via_ipc_zmq` with the project's extension; real ZeroMQ sockets."""
    import zmq

    export = bf16_export()
    stream = trainer_stream(export)
    info = trainer_plan(export)[1]
    handles = InProcessIpcHandles()
    monkeypatch.setattr(nemo.policy_utils, "get_handle_from_tensor", handles.handle)
    monkeypatch.setattr(nemo.backend, "rebuild_cuda_tensor_from_ipc", handles.rebuild)
    model = nemo.stand_in.RecordingModel(FP8_LAYERS)
    ext = extension(nemo, model)
    ext.prepare_refit_info(info)
    address = f"ipc://{tmp_path}/refit.sock"
    context = zmq.Context()
    sender = context.socket(zmq.REQ)
    sender.setsockopt(zmq.RCVTIMEO, 200_000)
    sender.bind(address)
    ext.zmq_socket = context.socket(zmq.REP)
    ext.zmq_socket.setsockopt(zmq.RCVTIMEO, 200_000)
    ext.zmq_socket.connect(address)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            nemo.policy_utils.stream_weights_via_ipc_zmq_impl(
                params_generator=iter(trainer_stream(export)),
                buffer_size_bytes=2 * 160 * 1024,  # several chunks; pairs split across some
                zmq_socket=sender,
                rank=1,
                worker_name="trainer",
            )
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    with cpu_cuda(monkeypatch):
        thread = threading.Thread(target=send)
        thread.start()
        ok = ext.update_weights_via_ipc_zmq()
        thread.join(timeout=300)
    context.destroy(linger=0)
    assert not errors, errors
    assert ok
    assert len(model.calls) > 2  # more than one chunk travelled
    same(received(model), [(n, t) for n, t in stream if not n.startswith("draft.")])
    same(received(model), generator_calls(nemo, export)[0])


class CpuTorch(types.ModuleType):
    """`torch` as NeMo RL's packing module sees it, with its CUDA entry points on the CPU:
    `torch.cuda.Stream`/`stream`/`current_device` and `torch.empty(..., device="cuda")`."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            Stream=CpuStream,
            stream=lambda s: contextlib.nullcontext(),
            current_device=lambda: "cpu",
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)


class RecordingBroadcastGroup:
    """The NCCL group: while sending, `broadcast` records each packed buffer (rank 0); while
    receiving, it fills the consumer's buffer with the next recorded one (a vLLM rank)."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.receiving = False
        self.next = 0

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        if not self.receiving:
            self.sent.append(tensor.clone())
            return
        tensor.copy_(self.sent[self.next])
        self.next += 1


def test_packed_broadcast_round_trip(nemo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trainer: NeMo RL's `packed_broadcast_producer` over the quantized stream; vLLM: its
    `update_weights_from_collective` (`packed_broadcast_consumer`) sized from the metadata."""
    export = bf16_export()
    stream = trainer_stream(export)
    info = trainer_plan(export)[1]
    monkeypatch.setattr(nemo.packed, "torch", CpuTorch())
    monkeypatch.setattr(nemo.packed, "get_target_packed_tensor_size", lambda: 64 * 1024)
    group = RecordingBroadcastGroup()
    nemo.packed.packed_broadcast_producer(
        iterator=iter(trainer_stream(export)), group=group, src=0, post_iter_func=lambda x: x[1]
    )
    assert len(group.sent) > 2
    model = nemo.stand_in.RecordingModel(FP8_LAYERS)
    ext = extension(nemo, model)
    ext.prepare_refit_info(info)
    ext.model_update_group = group
    group.receiving = True
    with cpu_cuda(monkeypatch):
        ok = ext.update_weights_from_collective()
    assert ok is not False
    assert group.next == len(group.sent)
    same(received(model), [(n, t) for n, t in stream if not n.startswith("draft.")])
