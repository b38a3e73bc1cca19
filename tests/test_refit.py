"""Refit bridge on a tiny transformers Qwen3: names, plan, buckets, verification, receiver."""

from __future__ import annotations

import pickle

import pytest
import torch

from nemo_fp8_rl.fp8 import FP8Spec, dequantize, fake_quantize, scale_from_amax
from nemo_fp8_rl.refit import (
    AttentionLayout,
    MappingError,
    ModuleReceiver,
    RefitError,
    RefitPlan,
    RefitPlanError,
    collect,
    hf_to_engine,
    megatron_to_hf,
    stream_refit,
)
from nemo_fp8_rl.refit.names import split_qkv
from nemo_fp8_rl.refit.vllm_receiver import check_against_checkpoint


def _cfg(**vllm_cfg) -> dict:
    return {"policy": {"generation": {"vllm_cfg": {"precision": "fp8", **vllm_cfg}}}}


def _tiny_qwen3(seed: int = 0, hidden: int = 128, layers: int = 3) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model: torch.nn.Module, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, snap[k]) for k, v in model.state_dict().items())


# --- names -------------------------------------------------------------------------------


def test_split_qkv_follows_megatron_group_interleaving() -> None:
    layout = AttentionLayout(num_attention_heads=6, num_query_groups=2, head_dim=2)
    # Label each row with (group, slot): slots 0..2 are the group's q heads, 3 is k, 4 is v.
    rows = [[g * 10 + slot] * 3 for g in range(2) for slot in range(5) for _ in range(2)]
    q, k, v = split_qkv(torch.tensor(rows, dtype=torch.float32), layout, "qkv")
    assert q[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 10, 10, 11, 11, 12, 12]
    assert k[:, 0].tolist() == [3, 3, 13, 13]
    assert v[:, 0].tolist() == [4, 4, 14, 14]


def test_megatron_names_and_errors() -> None:
    layout = AttentionLayout(4, 2, 8)
    out = megatron_to_hf("decoder.layers.3.mlp.linear_fc1.weight", torch.zeros(32, 8), layout)
    assert [n for n, _ in out] == [
        "model.layers.3.mlp.gate_proj.weight",
        "model.layers.3.mlp.up_proj.weight",
    ]
    grouped = megatron_to_hf(
        "decoder.layers.0.mlp.experts.linear_fc2.weight7", torch.zeros(8, 4), layout
    )
    assert grouped[0][0] == "model.layers.0.mlp.experts.7.down_proj.weight"
    te_norm = megatron_to_hf(
        "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", torch.ones(8), layout
    )
    assert te_norm[0][0] == "model.layers.1.input_layernorm.weight"
    assert (
        megatron_to_hf("decoder.layers.0.mlp.linear_fc1._extra_state", torch.zeros(1), layout) == []
    )
    with pytest.raises(MappingError, match="linear_qkv.*48 rows"):
        megatron_to_hf(
            "decoder.layers.0.self_attention.linear_qkv.weight", torch.zeros(48, 8), layout
        )
    with pytest.raises(MappingError, match="no HF equivalent"):
        megatron_to_hf("decoder.layers.0.self_attention.mystery.weight", torch.zeros(2), layout)


def test_hf_fused_experts_split_per_expert() -> None:
    gate_up = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    out = dict(hf_to_engine([("model.layers.0.mlp.experts.gate_up_proj", gate_up)]))
    assert torch.equal(out["model.layers.0.mlp.experts.1.gate_proj.weight"], gate_up[1, :3])
    assert torch.equal(out["model.layers.0.mlp.experts.1.up_proj.weight"], gate_up[1, 3:])


# --- plan --------------------------------------------------------------------------------


def test_plan_reads_nemo_rl_keys() -> None:
    names = [n for n, _ in _tiny_qwen3().named_parameters()]
    assert RefitPlan.from_config({}, names).scheme == "bf16"
    plan = RefitPlan.from_config(
        _cfg(num_last_layers_in_bf16=1, quantization_ignored_layer_kws=["o_proj"]), names
    )
    assert plan.scheme == "block" and plan.scale == "fp32"
    assert plan.is_fp8("model.layers.0.mlp.down_proj.weight")
    for kept in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.2.mlp.up_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
    ):
        assert not plan.is_fp8(kept), kept
    assert "model.layers.2.self_attn.q_proj" in plan.ignored_layers
    assert plan.quantization_config()["weight_block_size"] == [128, 128]
    assert RefitPlan.from_config(_cfg(use_deep_gemm=True), names).scale == "pow2"
    e8m0 = _cfg(env_vars={"VLLM_USE_DEEP_GEMM_E8M0": "1"})
    assert RefitPlan.from_config(e8m0, names).scale == "pow2"
    off = _cfg(use_deep_gemm=True, env_vars={"VLLM_USE_DEEP_GEMM": "0"})
    assert RefitPlan.from_config(off, names).scale == "fp32"
    assert RefitPlan.from_config(
        _cfg(pow2_weight_scaling_factors=True), names
    ).spec == FP8Spec.preset("blockwise_pow2")
    quant = {
        "policy": {
            "generation": {
                "vllm_cfg": {"precision": "fp8"},
                "vllm_kwargs": {"quantization": "fp8_per_channel"},
            }
        }
    }
    assert RefitPlan.from_config(quant, names).scheme == "channel"
    assert RefitPlan.from_config({"refit": {"bucket_size_mb": 3}}, names).bucket_bytes == 3 * 2**20


@pytest.mark.parametrize(
    ("recipe", "scheme", "scale"),
    [
        ("llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8", "block", "pow2"),
        ("tiny/grpo-tiny-qwen3-cpu-bf16", "bf16", "fp32"),
    ],
)
def test_plan_from_shipped_recipes(recipe: str, scheme: str, scale: str) -> None:
    from nemo_fp8_rl.config import load_recipe

    config = load_recipe(recipe).config
    names = ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    plan = RefitPlan.from_config(config, names)
    assert (plan.scheme, plan.scale) == (scheme, scale)
    assert plan.bucket_bytes == config["refit"]["bucket_size_mb"] * 2**20
    assert plan.is_fp8(names[0]) is (scheme != "bf16") and not plan.is_fp8(names[1])


def test_plan_rejects_what_it_cannot_produce() -> None:
    with pytest.raises(RefitPlanError, match="is_mx"):
        RefitPlan.from_config(_cfg(is_mx=True), ["x"])
    bad = {
        "policy": {
            "generation": {"vllm_cfg": {"precision": "fp8"}, "vllm_kwargs": {"quantization": "awq"}}
        }
    }
    with pytest.raises(RefitPlanError, match="'awq'"):
        RefitPlan.from_config(bad, ["x"])


def test_plan_keeps_misaligned_fused_modules_bf16_for_vllm() -> None:
    model = _tiny_qwen3(hidden=128)  # k/v have 64 rows: not on vLLM's 128-row scale grid
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    plan = RefitPlan.from_config(_cfg(), shapes)
    assert not plan.is_fp8("model.layers.0.self_attn.k_proj.weight")
    assert not plan.is_fp8("model.layers.0.self_attn.q_proj.weight")
    assert plan.is_fp8("model.layers.0.mlp.gate_proj.weight")
    assert "model.layers.0.self_attn.v_proj" in plan.ignored_layers
    # A plan built from names only cannot know; the vLLM receiver refuses such a refit.
    unchecked = RefitPlan.from_config(_cfg(), list(shapes))
    received = collect(stream_refit(model.named_parameters(), unchecked))
    engine = {name: tuple(t.shape) for name, t in received.engine_items()}
    with pytest.raises(RefitError, match="build the plan with shapes") as err:
        check_against_checkpoint(received, engine)
    assert "model.layers.0.self_attn.k_proj.weight" in err.value.names
    assert (
        "model.layers.0.self_attn.v_proj.weight" not in err.value.names
    )  # the last shard may be ragged


# --- streaming and receiving -------------------------------------------------------------


def test_buckets_are_bounded_picklable_and_carry_manifests() -> None:
    model = _tiny_qwen3()
    plan = RefitPlan.from_config(_cfg(), list(dict(model.named_parameters())), target="module")
    bound = 40_000
    buckets = list(stream_refit(model.named_parameters(), plan, bucket_bytes=bound))
    assert [b.index for b in buckets] == list(range(len(buckets))) and buckets[-1].last
    for b in buckets:
        assert b.nbytes <= bound or len(b.tensors) == 1
        assert [e.name for e in b.entries] == list(b.tensors)
    names = {e.name for b in buckets for e in b.entries}
    assert "model.layers.0.mlp.up_proj.weight_scale_inv" in names
    clone = pickle.loads(pickle.dumps(buckets))
    target = _tiny_qwen3(seed=5)
    ModuleReceiver(target).apply(clone)
    w = model.get_parameter("model.layers.1.mlp.down_proj.weight")
    got = target.get_parameter("model.layers.1.mlp.down_proj.weight")
    assert torch.equal(got, fake_quantize(w, plan.spec))


def test_tensorwise_shares_one_scale_across_fused_shards() -> None:
    model = _tiny_qwen3()
    quant = {
        "policy": {
            "generation": {
                "vllm_cfg": {"precision": "fp8"},
                "vllm_kwargs": {"quantization": "fp8_per_tensor"},
            }
        }
    }
    plan = RefitPlan.from_config(quant, list(dict(model.named_parameters())), target="module")
    out = {n: t for b in stream_refit(model.named_parameters(), plan) for n, t in b.tensors.items()}
    prefix = "model.layers.0.self_attn."
    scales = [out[f"{prefix}{p}_proj.weight_scale"] for p in "qkv"]
    assert scales[0].shape == () and all(torch.equal(s, scales[0]) for s in scales)
    fused = torch.cat([model.get_parameter(f"{prefix}{p}_proj.weight") for p in "qkv"]).detach()
    want = scale_from_amax(fused.abs().amax().reshape(1), 448.0, pow2=False)[1].reshape(())
    assert torch.equal(scales[0], want)
    assert torch.allclose(scales[0], fused.abs().amax() / 448)
    spec = plan.spec
    q_hat = dequantize(out[prefix + "q_proj.weight"], scales[0], spec)
    assert torch.equal(q_hat, fake_quantize(fused, spec)[: q_hat.shape[0]])


def test_receiver_works_on_fp8_emulated_model() -> None:
    from nemo_fp8_rl.fp8.emulation import convert_to_fp8_emulation

    src, dst = _tiny_qwen3(seed=1), _tiny_qwen3(seed=2)
    convert_to_fp8_emulation(dst, weight_spec="blockwise", act_spec="rowwise")
    plan = RefitPlan.from_config(_cfg(), list(dict(src.named_parameters())), target="module")
    ModuleReceiver(dst).apply(stream_refit(src.named_parameters(), plan))
    tokens = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.isfinite(dst(tokens).logits).all()
    assert torch.equal(
        dst.get_parameter("model.embed_tokens.weight"),
        src.get_parameter("model.embed_tokens.weight").to(torch.bfloat16).float(),
    )


def test_sender_names_the_nonfinite_tensor() -> None:
    model = _tiny_qwen3()
    with torch.no_grad():
        model.get_parameter("model.layers.1.mlp.up_proj.weight")[3, 4] = float("nan")
    plan = RefitPlan.from_config(_cfg(), list(dict(model.named_parameters())), target="module")
    with pytest.raises(RefitError, match=r"model\.layers\.1\.mlp\.up_proj\.weight: 1 of"):
        list(stream_refit(model.named_parameters(), plan))


def _refit(src: torch.nn.Module, **kw) -> list:
    plan = RefitPlan.from_config(_cfg(), list(dict(src.named_parameters())), target="module")
    return list(stream_refit(src.named_parameters(), plan, bucket_bytes=50_000, **kw))


@pytest.mark.parametrize(
    "defect", ["nan_fp8", "nan_bf16", "shape", "missing", "unexpected", "corrupt", "truncated"]
)
def test_failed_refit_leaves_receiver_unchanged(defect: str) -> None:
    src, dst = _tiny_qwen3(seed=1), _tiny_qwen3(seed=2)
    snap = _snapshot(dst)
    bad_name = "model.layers.2.self_attn.k_proj.weight"
    named = dict(src.named_parameters())
    if defect in ("nan_fp8", "nan_bf16"):
        bad_name = bad_name if defect == "nan_fp8" else "model.layers.0.input_layernorm.weight"
        with torch.no_grad():
            named[bad_name][0, ...] = float("nan")
        buckets = _refit(src, check_finite=False)
    elif defect == "shape":
        named[bad_name] = torch.nn.Parameter(named[bad_name][:-1].detach().clone())
        plan = RefitPlan.from_config(_cfg(), list(named), target="module")
        buckets = list(stream_refit(named.items(), plan, bucket_bytes=50_000))
    elif defect == "missing":
        del named[bad_name]
        plan = RefitPlan.from_config(_cfg(), list(named), target="module")
        buckets = list(stream_refit(named.items(), plan))
    elif defect == "unexpected":
        bad_name = "model.layers.9.mlp.down_proj.weight"
        named[bad_name] = named["model.layers.0.mlp.down_proj.weight"]
        plan = RefitPlan.from_config(_cfg(), list(named), target="module")
        buckets = list(stream_refit(named.items(), plan))
    elif defect == "corrupt":
        buckets = _refit(src)
        bucket = next(b for b in buckets if bad_name in b.tensors)
        bucket.tensors[bad_name].view(torch.uint8)[0] ^= 1
    else:
        buckets = _refit(src)[:-1]
        bad_name = None
    with pytest.raises(RefitError) as err:
        ModuleReceiver(dst).apply(buckets)
    assert _same(dst, snap)
    if defect == "corrupt":  # without checksums the flipped bit is not noticed
        ModuleReceiver(dst).apply(buckets, checksums=False)
        assert not _same(dst, snap)
    if bad_name:
        assert bad_name in err.value.names and bad_name in str(err.value)
    ModuleReceiver(dst).apply(_refit(_tiny_qwen3(seed=3)))  # a good refit afterwards goes through
    assert not _same(dst, snap)


def test_nonfinite_count_matches_isfinite_for_every_dtype() -> None:
    from nemo_fp8_rl.refit.stream import nonfinite_count

    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0, 0.0])
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e5m2):
        assert nonfinite_count(x.to(dtype)) == 3, dtype
    assert nonfinite_count(x.to(torch.float8_e4m3fn)) == 1  # e4m3fn saturates Inf, keeps NaN
    assert nonfinite_count(torch.randn(64, 64)) == 0


def test_stream_is_lazy_holding_one_bucket_at_a_time() -> None:
    """The sender pulls source tensors only as buckets fill: never the whole model at once."""
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(20)]
    pulled: list[str] = []

    def source():
        for name in names:
            pulled.append(name)
            yield name, torch.randn(128, 256)

    plan = RefitPlan.from_config(_cfg(), names, target="module")
    per_tensor = 128 * 256 + 2 * 4  # FP8 bytes + a [1, 2] FP32 block scale
    stream = stream_refit(source(), plan, bucket_bytes=3 * per_tensor)
    first = next(stream)
    assert len(first.tensors) == 6 and len(pulled) == 4  # 3 weights + scales, one pulled ahead
    assert sum(len(b.tensors) for b in stream) == 34 and len(pulled) == 20
