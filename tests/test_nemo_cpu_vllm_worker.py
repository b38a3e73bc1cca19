"""NeMo RL's own vLLM generation worker on vLLM's CPU build (`engines.nemo.cpu.vllm_worker`).

Runs in the NeMo RL environment with vLLM (`scripts/nemo-rl-contract.sh --vllm`): a real Ray
actor of `CpuVllmGenerationWorker` (NeMo RL's `VllmGenerationWorkerImpl`, four answers) serving
a tiny Qwen3 in block FP8 through `vllm.LLM` and the CPU block-FP8 kernel (AMX), with the
project's CPU extension injected. Checked: the subclass changes only the four GPU-only points,
the engine generates with NeMo RL's output spec, `sleep`/`wake_up` keep the weights, the device
id names the colocated socket, and a refit whose metadata disagrees with the served model is
refused in `prepare_refit_info` before any weight moves.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason

from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import AMX_FLAGS, cpu_flags

_no_amx = [f for f in AMX_FLAGS if f not in cpu_flags()]
pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here (scripts/nemo-rl-contract.sh --vllm builds it)",
    ),
    pytest.mark.skipif(bool(_no_amx), reason=f"block FP8 on vLLM's CPU build needs {_no_amx}"),
]
HANG_S = 1200  # a hung actor, not a slow one


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One FP8 `CpuVllmGenerationWorker` actor on a local Ray with one logical GPU."""
    import ray
    from test_nemo_cpu_generation_worker import gen_config

    from nemo_fp8_rl.engines.nemo.cpu import cluster
    from nemo_fp8_rl.engines.nemo.cpu import vllm_worker as vw
    from nemo_fp8_rl.engines.nemo.cpu.fp8_block_fit import model_misfits

    path = tiny_checkpoint(tmp_path_factory.mktemp("vllm") / "model")
    cfg = gen_config(path, precision="fp8", load_format="auto", enforce_eager=True)
    cfg["vllm_cfg"].update(use_deep_gemm=False, num_first_layers_in_bf16=0,
                           num_last_layers_in_bf16=0, is_mx=False,
                           quantization_ignored_layer_kws=model_misfits(path))  # fmt: skip
    cluster.set_environment()
    cluster.start_ray(1)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    actor = vw.CpuVllmGenerationWorker.options(num_gpus=1, runtime_env={"env_vars": env}).remote(
        cfg, bundle_indices=[0], seed=0
    )
    ray.get(actor.post_init.remote(), timeout=HANG_S)
    yield actor, path
    ray.get(actor.shutdown.remote(), timeout=HANG_S)
    cluster.stop_ray()


def tiny_checkpoint(path: Path) -> Path:
    """The CPU loop's tiny Qwen3 (`tiny-nemo` recipes' `local.model`, seed 1), untrained, as a
    Hugging Face folder with the embedded tokenizer and NeMo RL's chat template."""
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.config.project import LocalConfig
    from nemo_fp8_rl.tiny.handover import CHAT_TEMPLATE
    from nemo_fp8_rl.tiny.model import build_model, save_checkpoint
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    local = LocalConfig(**load_recipe("tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8").config["local"])
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    save_checkpoint(build_model(local.model, tokenizer, 1), tokenizer, path)
    return path


def _prompts(path: Path) -> Any:
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = [tok(p)["input_ids"] for p in ("12+7=", "3+40=", "9+9=")]
    width = max(map(len, ids))
    pad = tok.pad_token_id
    return BatchedDataDict(
        {
            "input_ids": torch.tensor([x + [pad] * (width - len(x)) for x in ids]),
            "input_lengths": torch.tensor([len(x) for x in ids]),
        }
    )


def _generate(worker: Any, greedy: bool = True) -> Any:
    import ray

    actor, path = worker
    return ray.get(actor.generate.remote(data=_prompts(path), greedy=greedy), timeout=HANG_S)


def test_a_batch_samples_the_same_tokens_whenever_it_is_drawn(worker: Any) -> None:
    """Per-request seeds from the batch (`request_seeds`): sampling the same batch twice gives the
    same tokens, as a resumed run must (the engine's one random stream would not)."""
    from nemo_fp8_rl.engines.nemo.cpu.vllm_worker import request_seeds

    first, second = _generate(worker, greedy=False), _generate(worker, greedy=False)
    assert torch.equal(first["output_ids"], second["output_ids"])
    assert torch.equal(first["logprobs"], second["logprobs"])
    data = _prompts(worker[1])
    seeds = request_seeds(0, data["input_ids"], data["input_lengths"])
    assert len(set(seeds)) == 3 and seeds == request_seeds(
        0, data["input_ids"], data["input_lengths"]
    )
    assert request_seeds(1, data["input_ids"], data["input_lengths"]) != seeds


def _metadata(path: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """What the policy worker's `prepare_refit_info` sends: HF names, BF16."""
    from safetensors.torch import load_file

    state = load_file(path / "model.safetensors")
    return {name: (t.shape, torch.bfloat16) for name, t in state.items()}


def test_the_subclass_answers_only_the_gpu_only_points_and_seeds_requests() -> None:
    from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorkerImpl
    from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl

    from nemo_fp8_rl.engines.nemo.cpu import vllm_worker as vw

    for impl, nemo, own in (
        (vw.CpuVllmGenerationWorkerImpl, VllmGenerationWorkerImpl,
         {"sleep", "wake_up", "generate", "_init_config", "post_init"}),
        (vw.CpuVllmAsyncGenerationWorkerImpl, VllmAsyncGenerationWorkerImpl,
         {"sleep_async", "wake_up_async", "post_init_async"}),
    ):  # fmt: skip
        assert impl.__mro__[1:3] == (vw._CpuVllm, nemo), impl.__mro__
        shared = {k for k, v in vars(vw._CpuVllm).items() if callable(v)}
        assert shared == {"__init__", "_init_config", "_create_engine"}, shared
        assert {k for k, v in vars(impl).items() if callable(v)} == own


def test_nemo_rls_worker_generates_in_block_fp8_on_cpu(worker: Any) -> None:
    out = _generate(worker)
    assert set(out) >= {"output_ids", "logprobs", "generation_lengths", "unpadded_sequence_lengths"}
    assert out["output_ids"].shape[0] == 3 and out["logprobs"].shape == out["output_ids"].shape
    lengths = _prompts(worker[1])["input_lengths"]
    for row, n, g in zip(out["logprobs"], lengths, out["generation_lengths"], strict=True):
        generated = row[int(n) : int(n) + int(g)]
        assert torch.isfinite(generated).all() and (generated <= 0).all(), row
    again = _generate(worker)
    assert torch.equal(again["output_ids"], out["output_ids"])  # greedy is deterministic


def test_sleep_and_wake_up_keep_the_served_weights(worker: Any) -> None:
    import ray

    actor, _ = worker
    before = _generate(worker)
    ray.get(actor.sleep.remote(), timeout=HANG_S)
    ray.get(actor.wake_up.remote(), timeout=HANG_S)
    after = _generate(worker)
    assert torch.equal(after["output_ids"], before["output_ids"])
    assert torch.equal(after["logprobs"], before["logprobs"])


def test_the_device_id_names_this_actors_logical_gpu(worker: Any) -> None:
    import ray

    actor, _ = worker
    (device,) = ray.get(actor.report_device_id.remote(), timeout=HANG_S)
    node = ray.get_runtime_context().get_node_id()
    assert device == f"CPU-{node}-GPU0", device


def test_refit_metadata_that_disagrees_with_vllms_model_is_refused(worker: Any) -> None:
    import ray

    actor, path = worker
    info = _metadata(path)
    ray.get(actor.prepare_refit_info.remote(info), timeout=HANG_S)  # the real one is accepted
    name = "model.layers.0.mlp.down_proj.weight"
    rows, cols = info[name][0]
    bad = {**info, name: (torch.Size([rows, cols + 1]), torch.bfloat16)}
    with pytest.raises(Exception, match=r"prepare_refit_info.*down_proj.*vLLM's model holds"):
        ray.get(actor.prepare_refit_info.remote(bad), timeout=HANG_S)
    q = "model.layers.1.self_attn.q_proj.weight"
    fp8 = {**info, q: (info[q][0], torch.float8_e4m3fn)}
    with pytest.raises(Exception, match=r"q_proj.*quantizes on receipt"):
        ray.get(actor.prepare_refit_info.remote(fp8), timeout=HANG_S)
    before = _generate(worker)
    assert torch.equal(_generate(worker)["logprobs"], before["logprobs"])


def test_vllm_serves_the_fp8_layers_with_its_cpu_block_fp8_kernel(worker: Any) -> None:
    """vLLM picked `CPUFp8BlockScaledMMKernel` (W8A16 on AMX) for the FP8 linear layers."""
    import ray

    def kernel_names(vllm_worker: Any) -> list[str]:  # inside vLLM's worker
        names = set()
        for module in vllm_worker.model_runner.model.modules():
            kernel = getattr(getattr(module, "quant_method", None), "fp8_linear", None)
            if kernel is not None:
                names.add(type(kernel).__name__)
        return sorted(names)

    def kernels_of_engine(generation_worker: Any) -> list[list[str]]:  # inside the actor
        return generation_worker.llm.collective_rpc(kernel_names)

    actor, _ = worker
    (kinds,) = ray.get(actor.__ray_call__.remote(kernels_of_engine), timeout=HANG_S)
    assert kinds == ["CPUFp8BlockScaledMMKernel"], kinds


# ---- NeMo RL's refit into vLLM's CPU build (`cpu.vllm_cpu_weights`) ---------------------------

PROBED = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _refit(worker: Any, noise: float) -> dict[str, Any]:
    """`_refit_inside` run in the actor's vLLM worker (closures: Ray pickles them by value)."""
    import ray

    actor, path = worker

    def _refit_inside(vllm_worker: Any, path: str, noise: float) -> dict[str, Any]:
        """Inside vLLM's worker: NeMo RL's refit path (`_weight_update_lifecycle` around
        `_load_weights`, in two batches, as `update_weights_via_ipc_zmq` runs it minus ZeroMQ) with
        the checkpoint's weights times (1 + noise * N(0, 1)); then each probed linear layer of
        decoder layer 0 as served against x @ W^T of the weights sent (an FP8 layer against the
        block-FP8 dequantization NeMo RL's refit quantizes them to)."""
        from nemo_rl.models.generation.vllm.quantization import fp8
        from safetensors.torch import load_file

        from nemo_fp8_rl.engines.nemo.cpu.vllm_cpu_weights import replaced

        model = vllm_worker.model_runner.model
        before = sorted(f"{type(layer).__name__}.{name}" for layer, name, _ in replaced(model))
        gen = torch.Generator().manual_seed(1)
        sent = {
            k: (v.float() * (1 + noise * torch.randn(v.shape, generator=gen))).to(torch.bfloat16)
            for k, v in load_file(f"{path}/model.safetensors").items()
        }
        items = list(sent.items())
        with vllm_worker._weight_update_lifecycle("ipc") as finalize:
            vllm_worker._load_weights(items[: len(items) // 2])
            vllm_worker._load_weights(items[len(items) // 2 :])
            finalize()
        errors = {}
        for probed in PROBED:
            layer = model.get_submodule(f"model.layers.0.{probed}")
            x = torch.randn(5, layer.input_size, generator=gen).to(torch.bfloat16)
            leaf = probed.rsplit(".", 1)[1]
            parts = [f"model.layers.0.{probed.rsplit('.', 1)[0]}.{p}.weight"
                     for p in FUSED.get(leaf, (leaf,))]  # fmt: skip
            w = torch.cat([sent[p] for p in parts]).float()
            if layer.weight.dtype == torch.float8_e4m3fn:
                q, s = fp8.cast_tensor_to_fp8_blockwise(w, weight_block_size=[128, 128])
                s = s.squeeze(-1).repeat_interleave(128, 0).repeat_interleave(128, 1)
                w = q.float() * s[: w.shape[0], : w.shape[1]]
            ref = x.float() @ w.T
            served = layer.quant_method.apply(layer, x).float()
            errors[probed] = float((served - ref).norm() / ref.norm())
        after = sorted(f"{type(layer).__name__}.{name}" for layer, name, _ in replaced(model))
        return {"replaced_before": before, "replaced_after": after, "errors": errors}

    def in_actor(generation_worker: Any) -> dict[str, Any]:
        (out,) = generation_worker.llm.collective_rpc(_refit_inside, args=(str(path), noise))
        return out

    return ray.get(actor.__ray_call__.remote(in_actor), timeout=HANG_S)


def test_the_fp8_layers_are_packed_for_vllms_cpu_kernel_from_the_start(worker: Any) -> None:
    """The engine's own load goes through NeMo RL's FP8 patch too, which skips the CPU kernel's
    packing: the worker packs after building the engine, so what is served before any refit
    is what the checkpoint holds (the same as after a refit of the same weights)."""
    import ray

    def fp8_weight_kinds(vllm_worker: Any) -> list[str]:  # inside vLLM's worker
        return sorted({type(m.weight).__name__ for m in vllm_worker.model_runner.model.modules()
                       if getattr(m, "weight", None) is not None
                       and m.weight.dtype == torch.float8_e4m3fn})  # fmt: skip

    def in_actor(generation_worker: Any) -> list[list[str]]:
        return generation_worker.llm.collective_rpc(fp8_weight_kinds)

    actor, _ = worker
    (kinds,) = ray.get(actor.__ray_call__.remote(in_actor), timeout=HANG_S)
    assert kinds == ["Parameter"], kinds  # packed: plain parameters, not vLLM's loader classes


def test_a_refit_loads_into_the_parameters_vllms_cpu_build_replaced_and_serves_them(
    worker: Any,
) -> None:
    """vLLM's CPU build empties each unquantized linear weight (packed for its GEMM) and its FP8
    kernel replaces the FP8 weight and scales by VNNI-packed plain parameters: NeMo RL's refit
    loads into them all the same (`restore_replaced` before, `pack_fp8` after), and every probed
    layer then computes from the weights sent: BF16 to BF16 rounding, FP8 to the kernel's
    rounding of the block-FP8 dequantization (W8A16). Without the restore the refit fails
    ("'Parameter' object has no attribute 'weight_loader'"); without the packing the
    FP8 layers' outputs are unrelated to their weights (relative error about 1.4)."""
    first = _refit(worker, noise=0.0)
    assert {e < 0.01 for e in first["errors"].values()} == {True}, first["errors"]
    before = _generate(worker)
    perturbed = _refit(worker, noise=0.3)
    # what vLLM's CPU processing replaced, again replaced after the refit's finalize
    assert perturbed["replaced_before"] == perturbed["replaced_after"] == first["replaced_after"]
    kinds = {name.split(".")[0] for name in perturbed["replaced_before"]}
    assert kinds == {"QKVParallelLinear", "RowParallelLinear", "MergedColumnParallelLinear"}
    assert {e < 0.01 for e in perturbed["errors"].values()} == {True}, perturbed["errors"]
    assert not torch.equal(_generate(worker)["logprobs"], before["logprobs"])
    back = _refit(worker, noise=0.0)
    assert {e < 0.01 for e in back["errors"].values()} == {True}, back["errors"]
    again = _generate(worker)  # the same weights sent again: the same tokens and log-probs
    assert torch.equal(again["output_ids"], before["output_ids"])
    assert torch.equal(again["logprobs"], before["logprobs"])
