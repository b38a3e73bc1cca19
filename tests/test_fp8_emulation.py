"""FP8 emulation modules on a real (tiny, randomly initialised) transformers Qwen3 model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nemo_fp8_rl.fp8 import FP8Spec, dequantize, fake_quantize, quantize
from nemo_fp8_rl.fp8.emulation import (
    FP8EmulatedLinear,
    calibrate_kv_scales,
    convert_to_fp8_emulation,
    enable_fp8_kv_cache_emulation,
    fp8_emulation,
    round_to_bf16,
)
from nemo_fp8_rl.fp8.kv_cache import kv_states, quantize_kv

W, A, G = FP8Spec.preset("blockwise"), FP8Spec.preset("rowwise"), FP8Spec.preset("rowwise")


def _tiny_qwen3(attn: str = "sdpa") -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _fq(t: torch.Tensor, spec: FP8Spec) -> torch.Tensor:
    q, s = quantize(t, spec)
    return dequantize(q, s, spec, dtype=t.dtype)


def test_convert_swaps_linears_in_place_and_keeps_parameters() -> None:
    model = _tiny_qwen3()
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    out = convert_to_fp8_emulation(model, weight_spec=W, act_spec=A, grad_spec=G)
    assert out is model
    converted = {n for n, m in model.named_modules() if isinstance(m, FP8EmulatedLinear)}
    assert len(converted) == 2 * 7  # q k v o gate up down per layer
    assert "lm_head" not in converted
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, FP8EmulatedLinear)


def test_module_filter_and_bad_specs() -> None:
    model = _tiny_qwen3()
    convert_to_fp8_emulation(
        model, weight_spec="blockwise", act_spec="rowwise", module_filter_fn=lambda m, n: "mlp" in n
    )
    names = [n for n, m in model.named_modules() if isinstance(m, FP8EmulatedLinear)]
    assert names and all(".mlp." in n for n in names)
    with pytest.raises(ValueError, match="act_spec.*rowwise"):
        convert_to_fp8_emulation(_tiny_qwen3(), weight_spec=W, act_spec="blockwise")
    with pytest.raises(ValueError, match="unknown FP8 preset"):
        convert_to_fp8_emulation(_tiny_qwen3(), weight_spec="block", act_spec=A)


def test_linear_forward_and_backward_match_the_formulas() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(300, 260)
    layer = FP8EmulatedLinear.from_linear(lin, weight_spec=W, act_spec=A, grad_spec=G)
    x = (torch.randn(3, 5, 300) * 4).requires_grad_(True)
    y = layer(x)
    xb, wb = round_to_bf16(x.detach()), round_to_bf16(lin.weight.detach())
    x_q, w_q = _fq(xb, A), _fq(wb, W)
    expected = round_to_bf16(x_q @ w_q.t() + lin.bias.detach())
    torch.testing.assert_close(y, expected, rtol=0, atol=0)

    g = torch.randn_like(y)
    y.backward(g)
    g2, x2 = g.reshape(-1, 260), xb.reshape(-1, 300)
    dx = round_to_bf16(_fq(g2, G) @ w_q).reshape(3, 5, 300)
    dw = round_to_bf16(_fq(g2.t().contiguous(), G).t().t() @ _fq(x2.t().contiguous(), A).t())
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    torch.testing.assert_close(lin.weight.grad, dw, rtol=0, atol=0)
    torch.testing.assert_close(lin.bias.grad, g2.sum(0))


def test_straight_through_gradients_without_grad_spec() -> None:
    torch.manual_seed(2)
    lin = nn.Linear(256, 128, bias=False)
    layer = FP8EmulatedLinear.from_linear(lin, weight_spec=W, act_spec=A, bf16=False)
    x = torch.randn(7, 256, requires_grad=True)
    layer(x).sum().backward()
    g = torch.ones(7, 128)
    torch.testing.assert_close(x.grad, g @ _fq(lin.weight.detach(), W))
    torch.testing.assert_close(lin.weight.grad, g.t() @ _fq(x.detach(), A))


def test_weight_cache_follows_optimizer_steps() -> None:
    lin = nn.Linear(128, 128)
    layer = FP8EmulatedLinear.from_linear(lin, weight_spec=W, act_spec=A)
    x = torch.randn(4, 128)
    with torch.no_grad():
        y0 = layer(x)
        lin.weight.mul_(2.0)
        y1 = layer(x)
    assert not torch.equal(y0, y1)
    torch.testing.assert_close(layer.quantized_weight(), _fq(round_to_bf16(lin.weight.detach()), W))


def test_fp8_off_is_the_bf16_shadow_pass() -> None:
    model = _tiny_qwen3()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        convert_to_fp8_emulation(model, weight_spec=W, act_spec=A, grad_spec=G)
        fp8 = model(ids).logits
        with fp8_emulation(model, enabled=False):
            shadow = model(ids).logits
        again = model(ids).logits
    torch.testing.assert_close(fp8, again, rtol=0, atol=0)  # switched back on after the block
    assert (fp8 - shadow).abs().max() > 1e-4  # FP8 changes the logits ...
    assert (fp8 - ref).abs().max() < 0.2 * ref.abs().max()  # ... but only a little
    assert (shadow - ref).abs().max() < (fp8 - ref).abs().max()  # BF16 rounding is smaller


def test_fake_quantize_preserves_dtype_and_passes_gradient() -> None:
    x = torch.randn(4, 256, dtype=torch.bfloat16, requires_grad=True)
    y = fake_quantize(x, A)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    (y * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_kv_cache_emulation(attn: str) -> None:
    model = _tiny_qwen3(attn)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits
        enable_fp8_kv_cache_emulation(model, k_scale=0.05, v_scale=0.05)
        kv = model(ids).logits
        with fp8_emulation(model, enabled=False):
            off = model(ids).logits
        # incremental decoding with the cache sees the same quantized K/V as a full forward
        out = model(ids[:, :9], use_cache=True)
        step = model(ids[:, 9:], past_key_values=out.past_key_values, use_cache=True).logits
    torch.testing.assert_close(off, ref, rtol=0, atol=0)
    assert (kv - ref).abs().max() > 1e-5
    torch.testing.assert_close(step[:, -1], kv[:, -1], rtol=1e-5, atol=1e-5)


def test_kv_scale_calibration_and_quantizer() -> None:
    model = _tiny_qwen3()
    enable_fp8_kv_cache_emulation(model)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), calibrate_kv_scales(model):
        model(ids)
    states = list(kv_states(model))
    assert len(states) == 2
    for s in states:
        assert s.k_amax > 0 and s.k_scale == s.k_amax / 448.0 and s.v_scale == s.v_amax / 448.0
    t = torch.randn(1000) * 3
    once = quantize_kv(t, 0.01)
    assert torch.equal(quantize_kv(once, 0.01), once)
    assert once.abs().max() <= 448 * 0.01 + 1e-6
    with pytest.raises(ValueError, match="k_scale"):
        enable_fp8_kv_cache_emulation(model, k_scale=0.0)


def test_converted_model_pickles_and_deep_copies() -> None:
    import copy
    import pickle

    model = _tiny_qwen3()
    convert_to_fp8_emulation(model, weight_spec=W, act_spec=A, grad_spec=G)
    enable_fp8_kv_cache_emulation(model, k_scale=0.05, v_scale=0.05)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = model(ids).logits
        for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            torch.testing.assert_close(clone(ids).logits, ref, rtol=0, atol=0)
