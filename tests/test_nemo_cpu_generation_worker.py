"""Contract: the CPU loop's generation worker behind NeMo RL's real generation and refit code.

Runs against a NeMo RL tree (`scripts/nemo-rl-contract.sh /path/to/nemo-rl`). The worker is
built in this process from a tiny HF Qwen3 checkpoint written here; NeMo RL's vLLM-side
modules import against the package's named vLLM stand-ins (`cpu.vllm_names`). NeMo RL's own
code runs as shipped: `verify_right_padding`, `init_fp8`, `fp8.load_weights` (quantization on
receipt), `VllmInternalWorkerExtension.prepare_refit_info` / `update_weights_via_ipc_zmq` and
`stream_weights_via_ipc_zmq_impl` over real ZeroMQ sockets, with the package's CPU IPC
handles (`cpu.ipc`) in place of CUDA ones and `torch.cuda.current_stream` answered on CPU for
the sender.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]

LAYERS = 3
PROMPTS = ["12+34=", "7*8=", "abc"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint (`write_checkpoint`) in a fresh folder."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))


def write_checkpoint(path: Path) -> Path:
    """A tiny HF Qwen3 checkpoint with the embedded engine's tokenizer; 192-wide layers, so
    the 128x128 FP8 blocks include partial ones."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.padding_side = "right"
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=192,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=48,
        intermediate_size=320,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        architectures=["Qwen3ForCausalLM"],
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the init, so FP8 rounding shows in log-probs
        for p in model.parameters():
            p.mul_(4.0)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def nemo() -> Any:
    """NeMo RL's modules and the worker module, imported against the vLLM names."""
    from nemo_fp8_rl.engines.nemo.cpu import vllm_names

    if vllm_names.vllm_installed():
        pytest.skip("vLLM is installed here: these tests drive NeMo RL with vLLM stand-ins")
    with vllm_names.installed():
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict
        from nemo_rl.models.generation.vllm import vllm_backend, vllm_generation
        from nemo_rl.models.generation.vllm.quantization import fp8
        from nemo_rl.models.policy import utils as policy_utils

        from nemo_fp8_rl.engines.nemo.cpu import generation_worker, ipc, served_model, worker_choice

        yield types.SimpleNamespace(
            BatchedDataDict=BatchedDataDict,
            backend=vllm_backend,
            vllm_generation=vllm_generation,
            fp8=fp8,
            policy_utils=policy_utils,
            gw=generation_worker,
            ipc=ipc,
            served=served_model,
            choice=worker_choice,
        )


def gen_config(path: Path, **vllm: Any) -> dict[str, Any]:
    """`policy.generation` as NeMo RL's `configure_generation_config` leaves it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return {
        "backend": "vllm",
        "model_name": str(path),
        "max_new_tokens": 8,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": None,
        "val_temperature": 1.0,
        "val_top_p": 1.0,
        "val_top_k": None,
        "stop_token_ids": [tok.eos_token_id],
        "stop_strings": None,
        "_pad_token_id": tok.pad_token_id,
        "colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}},
        "vllm_cfg": {
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
            "expert_parallel_size": 1,
            "gpu_memory_utilization": 0.5,
            "max_model_len": 64,
            "async_engine": False,
            "precision": "bfloat16",
            "kv_cache_dtype": "auto",
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            **vllm,
        },
    }


def make_worker(nemo: Any, cfg: dict[str, Any], trainer: bool = False) -> Any:
    """The worker as `RayWorkerBuilder` builds it: `configure_worker`'s kwargs, then init."""
    cls = nemo.gw.CpuTrainerFp8GenerationWorkerImpl if trainer else nemo.gw.CpuGenerationWorkerImpl
    resources, env, init_kwargs, runtime = cls.configure_worker(0.5, (0, [0]), 1)
    assert resources == {"num_gpus": 0.5} and init_kwargs == {"bundle_indices": [0], "seed": 0}
    worker = cls(copy.deepcopy(cfg), **init_kwargs)
    worker.post_init()
    return worker


def prompts(nemo: Any, path: Path) -> Any:
    """Right-padded prompts as NeMo RL's rollout builds them (`input_ids`, `input_lengths`)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    rows = [[tok.bos_token_id, *tok.convert_tokens_to_ids(list(p))] for p in PROMPTS]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    return nemo.BatchedDataDict({"input_ids": ids, "input_lengths": lengths})


def generated_logprobs(out: Any) -> list[torch.Tensor]:
    """Each row's generation log-probs, cut out of NeMo RL's padded `logprobs`."""
    ends = out["unpadded_sequence_lengths"].tolist()
    gens = out["generation_lengths"].tolist()
    return [out["logprobs"][i, e - g : e] for i, (e, g) in enumerate(zip(ends, gens, strict=True))]


def forward_logprobs(model: Any, out: Any, temperature: float = 1.0) -> list[torch.Tensor]:
    """Each row's generated tokens scored by one HF forward of its whole unpadded sequence."""
    rows = []
    for i in range(len(out["output_ids"])):
        n, g = int(out["unpadded_sequence_lengths"][i]), int(out["generation_lengths"][i])
        seq = out["output_ids"][i, :n][None]
        with torch.no_grad():
            logits = model(input_ids=seq, use_cache=False).logits[0].float() / temperature
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, seq[0, 1:, None])[:, 0]
        rows.append(lp[n - g - 1 :])
    return rows


def assert_logprobs_match(got: torch.Tensor, want: torch.Tensor) -> None:
    """Generation log-probs (KV cache, one token a step) against a whole-sequence forward.

    Both round to BF16 where vLLM computes in BF16; the two paths sum in different orders, so
    a hidden value near a BF16 rounding boundary can land on either side and move a later
    log-prob by up to ~0.1 (seen: 1 position in 24). A log-prob of another token or position
    is off by far more, and at most positions both paths agree to FP32 rounding.
    """
    diff = (got - want).abs()
    assert float(diff.max()) < 0.25, (got, want)
    assert float((diff < 2e-3).float().mean()) >= 0.75, (got, want)


# ---- generation ---------------------------------------------------------------------------


def test_generate_returns_nemo_rls_spec(nemo: Any, checkpoint: Path) -> None:
    cfg = gen_config(checkpoint)
    worker = make_worker(nemo, cfg)
    data = prompts(nemo, checkpoint)
    out = worker.generate(data, greedy=False)
    pad = cfg["_pad_token_id"]
    lengths, g = data["input_lengths"], out["generation_lengths"]
    assert out["output_ids"].shape == (3, data["input_ids"].shape[1] + int(g.max()))
    assert out["logprobs"].shape == out["output_ids"].shape
    assert out["logprobs"].dtype == torch.float32
    assert torch.equal(out["unpadded_sequence_lengths"], lengths + g)
    for i in range(3):
        n, k = int(lengths[i]), int(g[i])
        assert torch.equal(out["output_ids"][i, :n], data["input_ids"][i, :n])
        assert (out["output_ids"][i, n + k :] == pad).all()
        assert (out["logprobs"][i, :n] == 0).all() and (out["logprobs"][i, n + k :] == 0).all()
        assert (out["logprobs"][i, n : n + k] < 0).all()
        stopped = int(out["output_ids"][i, n + k - 1]) in cfg["stop_token_ids"]
        assert bool(out["truncated"][i]) == (not stopped and k == cfg["max_new_tokens"])
    # NeMo RL's own padding check accepts the output
    from nemo_rl.models.generation.interfaces import verify_right_padding

    assert verify_right_padding(out, pad_value=pad)[0]
    # the log-probs are those of the sampled tokens under the served weights
    got = [out["logprobs"][i, int(lengths[i]) : int(lengths[i] + g[i])] for i in range(3)]
    assert_logprobs_match(torch.cat(got), torch.cat(forward_logprobs(worker.model, out)))


def test_processed_logprobs_follow_the_temperature(nemo: Any, checkpoint: Path) -> None:
    cfg = gen_config(checkpoint, logprobs_mode="processed_logprobs")
    cfg["temperature"] = 0.7
    worker = make_worker(nemo, cfg)
    out = worker.generate(prompts(nemo, checkpoint))
    want = torch.cat(forward_logprobs(worker.model, out, temperature=0.7))
    assert_logprobs_match(torch.cat(generated_logprobs(out)), want)
    raw = torch.cat(forward_logprobs(worker.model, out, temperature=1.0))
    assert (torch.cat(generated_logprobs(out)) - raw).abs().max() > 0.05  # not the raw ones


def test_greedy_is_deterministic_and_sampling_follows_the_seed(nemo: Any, checkpoint: Path) -> None:
    """Greedy repeats itself; sampling draws from a generator seeded by the worker's seed and
    the batch's prompts, so the same batch samples the same again (a resumed run) and another
    seed samples otherwise."""
    cfg = gen_config(checkpoint)
    worker = make_worker(nemo, cfg)
    data = prompts(nemo, checkpoint)
    a, b = worker.generate(data, greedy=True), worker.generate(data, greedy=True)
    assert torch.equal(a["output_ids"], b["output_ids"]) and torch.equal(
        a["logprobs"], b["logprobs"]
    )
    first, again = worker.generate(data), worker.generate(data)
    assert torch.equal(first["output_ids"], again["output_ids"])
    other = nemo.gw.CpuGenerationWorkerImpl(copy.deepcopy(cfg), bundle_indices=[0], seed=1025)
    drawn = [other.generate(data)["output_ids"], first["output_ids"], a["output_ids"]]
    assert len({tuple(x.flatten().tolist()) for x in drawn}) == 3


def test_stop_strings_end_a_row_and_stay_in_it(nemo: Any, checkpoint: Path) -> None:
    worker = make_worker(nemo, gen_config(checkpoint))
    data = prompts(nemo, checkpoint)
    greedy = worker.generate(data, greedy=True)
    n, k = int(data["input_lengths"][0]), int(greedy["generation_lengths"][0])
    text = worker.tokenizer.decode(greedy["output_ids"][0, n : n + k])
    if len(text) < 3:
        pytest.skip(f"the greedy generation {text!r} is too short to cut")
    data["stop_strings"] = [[text[1:3]], None, None]
    cut = worker.generate(data, greedy=True)
    assert int(cut["generation_lengths"][0]) == 3
    assert not bool(cut["truncated"][0])
    assert torch.equal(cut["output_ids"][1], greedy["output_ids"][1, : cut["output_ids"].shape[1]])


def test_generate_text_decodes_the_greedy_generation(nemo: Any, checkpoint: Path) -> None:
    worker = make_worker(nemo, gen_config(checkpoint))
    texts = worker.generate_text(nemo.BatchedDataDict({"prompts": PROMPTS}), greedy=True)["texts"]
    rows = [worker.tokenizer(p)["input_ids"] for p in PROMPTS]  # as generate_text encodes
    width, pad = max(map(len, rows)), worker.cfg["_pad_token_id"]
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    data = nemo.BatchedDataDict(
        {"input_ids": ids, "input_lengths": torch.tensor(list(map(len, rows)))}
    )
    out = worker.generate(data, greedy=True)
    for i, text in enumerate(texts):
        n, k = int(data["input_lengths"][i]), int(out["generation_lengths"][i])
        ids = out["output_ids"][i, n : n + k]
        assert text == worker.tokenizer.decode(ids, skip_special_tokens=True)


def test_fp8_serves_nemo_rls_quantized_weights_and_changes_logprobs(
    nemo: Any, checkpoint: Path
) -> None:
    bf16 = make_worker(nemo, gen_config(checkpoint))
    fp8 = make_worker(nemo, gen_config(checkpoint, precision="fp8", num_first_layers_in_bf16=1))
    layers = fp8.model.model.layers
    assert layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16  # NeMo RL's BF16 layer
    q = layers[1].self_attn.q_proj
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight_scale_inv.shape == (2, 2)
    ref = bf16.model.model.layers[1].self_attn.q_proj.weight.float()
    with fp8.fp8.globals():
        w, s = nemo.fp8.cast_tensor_to_fp8_blockwise(ref, weight_block_size=[128, 128])
    assert torch.equal(q.weight.view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(q.weight_scale_inv, s.squeeze(-1))
    out = bf16.generate(prompts(nemo, checkpoint), greedy=True)
    lp_bf16 = torch.cat(forward_logprobs(bf16.model, out))
    lp_fp8 = torch.cat(forward_logprobs(fp8.model, out))
    diff = (lp_bf16 - lp_fp8).abs().max()
    assert 1e-3 < diff < 1.0, diff
    fp8_out = fp8.generate(prompts(nemo, checkpoint), greedy=True)
    want = torch.cat(forward_logprobs(fp8.model, fp8_out))
    assert_logprobs_match(torch.cat(generated_logprobs(fp8_out)), want)


def test_fp8_kv_cache_uses_the_refit_scales(nemo: Any, checkpoint: Path) -> None:
    worker = make_worker(nemo, gen_config(checkpoint, precision="fp8", kv_cache_dtype="fp8"))
    states = [
        m.fp8_kv_state for m in worker.model.model.layers.modules() if hasattr(m, "fp8_kv_state")
    ]
    assert len(states) == LAYERS and all(s.k_scale == 1.0 for s in states)
    worker.model.load_weights([("model.layers.1.self_attn.k_scale", torch.tensor([0.25]))])
    assert states[1].k_scale == 1.0  # staged, not yet committed
    worker.model.process_weights_after_loading()
    assert states[1].k_scale == 0.25


# ---- refit --------------------------------------------------------------------------------


def policy_export(checkpoint: Path, seed: int = 1) -> list[tuple[str, torch.Tensor]]:
    """What the policy streams: the checkpoint's HF-named weights, changed, in BF16 (the tied
    LM head sent once, as the embedding)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    return [
        (n, (p.detach() + 0.05 * torch.randn(p.shape, generator=g)).to(torch.bfloat16))
        for n, p in hf.named_parameters()
    ]


def metadata(stream: list[tuple[str, torch.Tensor]]) -> dict[str, tuple[Any, torch.dtype]]:
    return {n: (t.shape, t.dtype) for n, t in stream}


@contextlib.contextmanager
def cpu_ipc(nemo: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CPU IPC handles on both sides and the sender's stream fence answered on CPU."""
    monkeypatch.setattr(nemo.policy_utils, "get_handle_from_tensor", nemo.ipc.handle_from_tensor)
    monkeypatch.setattr(nemo.backend, "rebuild_cuda_tensor_from_ipc", nemo.ipc.rebuild_from_handle)
    fence = types.SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: fence)
    yield


def refit(
    nemo: Any,
    worker: Any,
    stream: list[tuple[str, torch.Tensor]],
    timeout_ms: int = 120_000,
    errors: list[BaseException] | None = None,
) -> bool:
    """NeMo RL's sender (a thread, binding the socket NeMo RL's policy worker binds) against
    the worker's `update_weights_via_ipc_zmq`; returns the worker's answer. The sender's
    errors fail the call unless an `errors` list is given to collect them."""
    import zmq

    address = f"ipc:///tmp/{worker.report_device_id()[0]}.sock"
    context = zmq.Context()
    sender = context.socket(zmq.REQ)
    sender.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sender.setsockopt(zmq.LINGER, 0)
    sender.bind(address)
    expect_errors = errors is not None
    errors = [] if errors is None else errors

    def send() -> None:
        try:
            nemo.policy_utils.stream_weights_via_ipc_zmq_impl(
                params_generator=iter(stream),
                buffer_size_bytes=2 * 200 * 1024,  # several chunks
                zmq_socket=sender,
                rank=0,
                worker_name="policy",
            )
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    try:
        ok = worker.update_weights_via_ipc_zmq()
    finally:
        thread.join(timeout=600)  # a hang, not a loaded machine
        sender.close()
        worker.extension.cleanup()
        del worker.extension.zmq_socket
        context.destroy(linger=0)
    assert expect_errors or not errors, errors
    return ok


def served_state(worker: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in worker.model.named_parameters()}


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a
    )
