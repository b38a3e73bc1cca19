"""A real megatron-core GPTModel (CPU) through the refit bridge into the matching transformers model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (dev group)")

from megatron_fixture import TinyGPT, build_megatron_gpt, cpu_megatron, hf_config, megatron_logits

from nemo_fp8_rl.fp8 import fake_quantize
from nemo_fp8_rl.refit import (
    AttentionLayout,
    ModuleReceiver,
    RefitPlan,
    megatron_to_engine,
    stream_refit,
)
from nemo_fp8_rl.refit.module_receiver import engine_targets

FP8_CONFIG = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}


def _bf16_round(model: torch.nn.Module) -> None:
    """Round every parameter to a BF16 value (kept in FP32) so a BF16 transfer is lossless."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def _megatron_and_hf(
    arch: str,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.nn.Module, AttentionLayout]:
    from transformers import AutoModelForCausalLM

    dims = TinyGPT(arch=arch)
    tokens = torch.randint(0, dims.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with cpu_megatron():
        model = build_megatron_gpt(dims)
        _bf16_round(model)
        logits = megatron_logits(model, tokens).float()
        layout = AttentionLayout.from_megatron_config(model.config)
        state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    torch.manual_seed(123)
    hf = (
        AutoModelForCausalLM.from_config(hf_config(dims), attn_implementation="eager")
        .float()
        .eval()
    )
    return state, logits, hf, layout


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_megatron_bf16_refit_matches_logits(arch: str) -> None:
    torch.set_num_threads(1)
    state, ref_logits, hf, layout = _megatron_and_hf(arch)
    mapped = dict(megatron_to_engine(state.items(), layout))
    assert set(mapped) == set(engine_targets(hf)), "mapping must cover every parameter exactly"

    plan = RefitPlan.from_config({}, list(mapped), target="module")
    assert plan.scheme == "bf16"
    buckets = list(stream_refit(mapped.items(), plan, bucket_bytes=64 * 1024))
    assert len(buckets) > 3
    assert ModuleReceiver(hf).apply(buckets) == len(mapped)

    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = hf(tokens).logits.float()
    assert logits.shape == ref_logits.shape
    torch.testing.assert_close(logits, ref_logits, atol=2e-4, rtol=1e-3)


def test_unrelated_weights_do_not_match() -> None:
    """The logits check can fail: the same HF model without the refit disagrees."""
    torch.set_num_threads(1)
    _, ref_logits, hf, _ = _megatron_and_hf("qwen3")
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = hf(tokens).logits.float()
    assert (logits - ref_logits).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("qwen3", {}),
        ("qwen3", {"pow2_weight_scaling_factors": True}),
        ("llama", {"num_first_layers_in_bf16": 1}),
        ("qwen3_moe", {}),
    ],
)
def test_megatron_fp8_refit_equals_fake_quantized(arch: str, overrides: dict) -> None:
    torch.set_num_threads(1)
    state, _, hf, layout = _megatron_and_hf(arch)
    mapped = dict(megatron_to_engine(state.items(), layout))
    vllm_cfg = {"precision": "fp8", **overrides}
    plan = RefitPlan.from_config(
        {"policy": {"generation": {"vllm_cfg": vllm_cfg}}}, list(mapped), target="module"
    )
    assert plan.fp8_names and plan.spec is not None
    ModuleReceiver(hf).apply(stream_refit(mapped.items(), plan, dtype=None))
    targets = engine_targets(hf)
    for name, original in mapped.items():
        got = targets[name].detach()
        want = fake_quantize(original, plan.spec) if plan.is_fp8(name) else original
        assert torch.equal(got, want.to(got.dtype)), name
    if overrides.get("num_first_layers_in_bf16"):
        assert not any(n.startswith("model.layers.0.") for n in plan.fp8_names)
        assert "model.layers.0.self_attn.q_proj" in plan.ignored_layers
    fp8_layers = {n.split(".")[2] for n in plan.fp8_names}
    assert fp8_layers, "some layer must be FP8"
