"""Trainer-side FP8 refit on a GPU: the Triton quantizer bit-exact, its speed, and a vLLM A/B.

1. The Triton path of `quantize_blockwise_like_nemo_rl` equals the torch path on CUDA, which is
   NeMo RL's `cast_tensor_to_fp8_blockwise` operation for operation (and NeMo RL's function
   itself when `NEMO_RL_SRC` names a tree): every distinct FP8 shape of one layer of the four
   shipped models plus odd shapes, with zero, subnormal and outlier-last-element blocks.
2. Throughput: the Triton quantizer over one Llama-3.1-8B layer's FP8 weights, as GB/s of BF16
   input and as a share of a device copy (`clone`) of the same bytes; beside it the torch path
   (the work NeMo RL's vLLM worker does per refit). Printed, not asserted.
3. vLLM A/B (needs vLLM; no download: a Qwen3-8B `config.json` cut to 2 layers, dummy weights,
   token-id prompts): random BF16 weights refit (a) generator-style, BF16 quantized with the
   torch path at the receiver, and (b) trainer-style, the pairs from `NemoFp8Layout`
   (Triton); both through vLLM's `reload_weights`. Greedy outputs must be identical; the refit
   time of each is printed. vLLM's own FP8 parameters are compared with `fp8_weight_names`.

Run by scripts/gpu_check.sh; skipped without CUDA (and the A/B without vLLM).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch

from nemo_fp8_rl.refit.hf_shapes import (
    RECIPE_MODELS,
    hf_weight_shapes,
    layer_shapes,
    recipe_model_config,
)
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules
from nemo_fp8_rl.refit.nemo_quant import quantize_blockwise_like_nemo_rl, quantize_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (gpu_check.sh)"),
]
FILES = list(RECIPE_MODELS)
_config = recipe_model_config


def _same(a, b) -> bool:
    nan = torch.isnan(b[1])
    return (
        torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
        and torch.equal(torch.isnan(a[1]), nan)
        and torch.equal(a[1].view(torch.int32)[~nan], b[1].view(torch.int32)[~nan])
    )


def _cases() -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = {s for f in FILES for n, s in layer_shapes(_config(f), 0).items() if len(s) == 2}
    shapes = sorted(s for s in shapes if s[0] % 128 == 0 and s[1] % 128 == 0 and s[1] > 128)
    out = [torch.randn(s, generator=g, device="cuda").mul(0.02).bfloat16() for s in shapes]
    for shape in [(130, 200), (1, 129), (300, 390), (4096, 1000)]:
        x = torch.randn(shape, generator=g, device="cuda") * torch.logspace(
            -30, 30, shape[1], device="cuda"
        )
        x[:128, :128] = 0
        x[-1, -1] = x.abs().max() * 2
        out.append(x.bfloat16())
    sub = torch.randn(256, 256, generator=g, device="cuda") * 1e-39  # tiny blocks: scale inf
    out.append(sub.bfloat16())
    return out


@pytest.mark.parametrize("pow2", [False, True])
def test_triton_path_is_bit_exact_on_cuda(pow2: bool) -> None:
    nemo = None
    if os.environ.get("NEMO_RL_SRC"):
        from nemo_fp8_rl.refit.nemo_reference import load_nemo_rl_fp8, nemo_rl_cast

        module = load_nemo_rl_fp8(os.environ["NEMO_RL_SRC"])
        nemo = lambda w: nemo_rl_cast(module, w, pow2)  # noqa: E731
    for x in _cases():
        ours = quantize_blockwise_like_nemo_rl(x, pow2_scale=pow2)
        assert _same(ours, quantize_reference(x, 128, pow2)), tuple(x.shape)
        if nemo is not None:
            assert _same(ours, nemo(x)), tuple(x.shape)


def _cuda_seconds(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def test_triton_quantizer_throughput_vs_hbm_copy() -> None:
    from nemo_fp8_rl.refit.nemo_quant_triton import quantize_triton

    cfg = _config(FILES[0])
    layout = NemoFp8Layout(layer_shapes(cfg, 0), NemoFp8Rules(num_layers=32))
    shapes = layer_shapes(cfg, 0)
    weights = [
        torch.randn(shapes[n], device="cuda").mul(0.02).bfloat16() for n in sorted(layout.fp8_names)
    ]
    nbytes = sum(w.numel() * 2 for w in weights)
    t_copy = _cuda_seconds(lambda: [w.clone() for w in weights])
    t_triton = _cuda_seconds(lambda: [quantize_triton(w, 128, False) for w in weights])
    t_torch = _cuda_seconds(lambda: [quantize_reference(w, 128, False) for w in weights], 5)
    print(
        f"\ntriton quantizer (one Llama-3.1-8B layer, {nbytes / 1e6:.0f} MB BF16): "
        f"{nbytes / t_triton / 1e9:.0f} GB/s = {t_copy / t_triton:.2f} of a device copy "
        f"({nbytes / t_copy / 1e9:.0f} GB/s); torch path (NeMo RL's vLLM-side ops) "
        f"{t_torch * 1e3:.2f} ms vs triton {t_triton * 1e3:.2f} ms ({t_torch / t_triton:.1f}x)"
    )


PROMPTS = [[1, 2, 3, 4, 5], [17, 99, 4, 1000], [300, 200, 100, 50, 25, 12], [7] * 8]


def _generate(llm) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _vllm_fp8_modules(llm) -> set[str]:
    """vLLM module prefixes whose weight is FP8 (e.g. `model.layers.0.self_attn.qkv_proj`)."""

    def fp8(model):
        return [
            n.rsplit(".", 1)[0]
            for n, p in model.named_parameters()
            if p.dtype == torch.float8_e4m3fn
        ]

    return set(llm.apply_model(fp8)[0])


def _as_vllm_modules(names) -> set[str]:
    out = set()
    for name in names:
        module = name.removesuffix(".weight")
        for old, new in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj"),
                         ("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj")):  # fmt: skip
            module = module.replace(f".{old}", f".{new}")
        out.add(module)
    return out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_vllm_refit_a_b(tmp_path: Path) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM

    cfg = _config(FILES[1], num_hidden_layers=2, torch_dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    block = {  # what NeMo RL's init_fp8 hands vLLM (FP8_BLOCK_QUANT_KWARGS)
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    llm = LLM(
        model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
        quantization="fp8", hf_overrides={"quantization_config": block}, enforce_eager=True,
        gpu_memory_utilization=0.3, max_model_len=256, distributed_executor_backend="uni",
    )  # fmt: skip
    shapes = dict(hf_weight_shapes(cfg))
    layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=2))
    try:
        assert _vllm_fp8_modules(llm) == _as_vllm_modules(layout.fp8_names)
    except AttributeError as exc:  # an LLM without apply_model
        print(f"\nvLLM FP8 parameter list not read ({exc})")
    g = torch.Generator(device="cuda").manual_seed(1)
    bf16 = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            bf16[name] = torch.ones(shape, device="cuda", dtype=torch.bfloat16)
        else:
            bf16[name] = (torch.randn(shape, generator=g, device="cuda") * 0.02).bfloat16()

    def generator_side():
        out = []
        for n, t in bf16.items():
            if layout.is_fp8(n):
                q, s = quantize_reference(t, 128, False)
                out += [(n, q), (n + "_scale_inv", s)]
            else:
                out.append((n, t))
        return out

    def trainer_side():
        return [e for n, t in bf16.items() for e in layout.quantize_named(n, t)]

    results = {}
    for label, make in (("generator", generator_side), ("trainer", trainer_side)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        items = make()
        torch.cuda.synchronize()
        quantized = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        torch.cuda.synchronize()
        results[label] = (items, _generate(llm), quantized - start, time.perf_counter() - quantized)
    (a_items, a_out, a_q, a_load), (b_items, b_out, b_q, b_load) = results.values()
    assert [n for n, _ in a_items] == [n for n, _ in b_items]
    for (_, x), (_, y) in zip(a_items, b_items, strict=True):
        assert (
            torch.equal(x.view(torch.uint8), y.view(torch.uint8)) or x.dtype != torch.float8_e4m3fn
        )
    assert a_out == b_out
    print(
        f"\nrefit A/B (Qwen3-8B shapes, 2 layers, {len(a_items)} tensors): greedy outputs "
        f"identical ({sum(map(len, a_out))} tokens); generator-style quantize {a_q * 1e3:.1f} ms "
        f"+ reload {a_load * 1e3:.1f} ms, trainer-style (Triton) quantize {b_q * 1e3:.1f} ms "
        f"+ reload {b_load * 1e3:.1f} ms"
    )
