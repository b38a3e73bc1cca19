"""NVFP4 variants of the rescue study (nemo_fp8_rl/fp8/fp4.py "Variants") and the trainer's BF16
layers (engines/local/precision.bf16_layers): what each changes, and that the defaults stay TE's."""

from __future__ import annotations

import pytest
import torch

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.local.precision import TrainingPrecision, bf16_layers
from nemo_fp8_rl.fp8.emulation import FP8EmulatedLinear
from nemo_fp8_rl.fp8.fp4 import FP4Spec, dequantize_fp4, quantize_fp4

RESCUE = "recipes/study/rescue"


def _err(x: torch.Tensor, spec: FP4Spec) -> torch.Tensor:
    """Squared error per row."""
    return ((dequantize_fp4(quantize_fp4(x, spec)) - x) ** 2).sum(dim=1)


def test_variants_are_nvfp4_only_and_row_scale_needs_row_tiles() -> None:
    with pytest.raises(ValueError, match="NVFP4 variants"):
        FP4Spec("mxfp4", (1, 32), four_over_six=True)
    with pytest.raises(ValueError, match="1 x 16 tiles"):
        FP4Spec("nvfp4", (16, 16), global_scale="row")
    assert FP4Spec("nvfp4", (1, 16), "row", True).granularity == "nvfp4-1x16-row-4over6"


def test_row_scale_equals_tensor_scale_on_one_row_and_helps_a_small_row() -> None:
    g = torch.Generator().manual_seed(0)
    one = torch.randn(1, 64, generator=g)
    a = quantize_fp4(one, FP4Spec("nvfp4", (1, 16)))
    b = quantize_fp4(one, FP4Spec("nvfp4", (1, 16), global_scale="row"))
    assert torch.equal(a.codes, b.codes) and torch.equal(dequantize_fp4(a), dequantize_fp4(b))
    # a row 1e-5 the size of the other: the tensor scale leaves its E4M3 block scales subnormal
    x = torch.cat([torch.randn(1, 64, generator=g) * 1e3, torch.randn(1, 64, generator=g) * 0.01])
    tensor, row = _err(x, FP4Spec("nvfp4", (1, 16))), _err(x, FP4Spec("nvfp4", (1, 16), "row"))
    assert row[1] < 0.5 * tensor[1]


def test_four_over_six_lowers_the_error_and_is_exact_where_four_fits() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 64, generator=g)
    x[1, 0] = 24.0  # the tensor's amax: g_enc = 1536 / 24 = 64, so s4 = 4 * 64 / 4 = 64 exactly
    x[0, :16] = torch.tensor([1.0, 2.0, 3.0, 4.0] * 4)  # 3 -> 4.5 under max 6 (off the grid)
    six = FP4Spec("nvfp4", (1, 16))
    four = FP4Spec("nvfp4", (1, 16), four_over_six=True)
    d6, d4 = dequantize_fp4(quantize_fp4(x, six)), dequantize_fp4(quantize_fp4(x, four))
    e6 = ((d6 - x) ** 2).view(8, 4, 16).sum(-1)
    e4 = ((d4 - x) ** 2).view(8, 4, 16).sum(-1)
    assert e4.sum() < e6.sum() and torch.any(
        e4 < e6
    )  # per tile not always: its tensor scale differs
    assert torch.equal(d4[0, :16], x[0, :16]) and not torch.equal(d6[0, :16], x[0, :16])


def test_four_over_six_on_weight_tiles() -> None:
    w = torch.randn(32, 32, generator=torch.Generator().manual_seed(2))
    six, four = FP4Spec("nvfp4", (16, 16)), FP4Spec("nvfp4", (16, 16), four_over_six=True)
    assert _err(w, four).sum() < _err(w, six).sum()


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({}, set()),
        ({"first_last_layers_bf16": True}, {0, 3}),  # Megatron-Core's defaults: 1 and 1
        ({"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 0}, {3}),
        ({"first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 2}, {0, 2, 3}),
        ({"first_last_layers_bf16": False, "num_layers_at_end_in_bf16": 2}, set()),
    ],
)
def test_bf16_layers_follow_megatron_core(over: dict, expected: set[int]) -> None:
    cfg = {"policy": {"megatron_cfg": {"model_overrides": over}}}
    assert bf16_layers(cfg, 4) == expected


def test_bf16_tail_recipe_keeps_the_last_layer_bf16_in_training() -> None:
    from nemo_fp8_rl.config.project import TinyModelConfig
    from nemo_fp8_rl.tiny.model import build_model
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    cfg = load_recipe(f"{RESCUE}/grpo-rescue-nvfp4-bf16-tail.yaml").config
    prec = TrainingPrecision.from_config(cfg)
    assert prec.bf16_layers == {1}
    model = build_model(TinyModelConfig(**cfg["local"]["model"]), build_tokenizer(), seed=1)
    prec.apply(model)
    on = {n: m.fp8_enabled for n, m in model.named_modules() if isinstance(m, FP8EmulatedLinear)}
    assert on and all(v == (".layers.0." in n) for n, v in on.items())


def test_variant_recipes_reach_the_specs() -> None:
    token = TrainingPrecision.from_config(
        load_recipe(f"{RESCUE}/grpo-rescue-nvfp4-token-scale.yaml").config
    )
    assert token.specs[1].global_scale == "row" and token.specs[0].global_scale == "tensor"
    four = TrainingPrecision.from_config(
        load_recipe(f"{RESCUE}/grpo-rescue-nvfp4-four-over-six.yaml").config
    )
    assert four.specs[0].four_over_six and four.specs[1].four_over_six


def test_variants_refused_off_nvfp4() -> None:
    from nemo_fp8_rl.config.errors import RecipeError

    with pytest.raises(RecipeError, match="NVFP4 variants"):
        load_recipe(f"{RESCUE}/grpo-rescue-mxfp4-noclip.yaml", ["local.fp4_four_over_six=true"])
