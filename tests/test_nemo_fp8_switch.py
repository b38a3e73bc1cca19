"""Switching Megatron-Core's FP8 compute off for the BF16 shadow pass, on a real GPTModel (CPU)."""

from __future__ import annotations

import pytest
import torch
from megatron_fixture import TinyGPT, build_megatron_gpt, cpu_megatron, megatron_logits

from nemo_fp8_rl.engines.nemo.fp8_switch import Fp8ComputeSwitch, transformer_configs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gpt():
    """A real megatron-core GPTModel; the tests run inside its single-process CPU setup."""
    with cpu_megatron():
        model = build_megatron_gpt(TinyGPT(num_layers=2))
        yield model


def test_switch_turns_fp8_off_everywhere_and_restores_it(gpt) -> None:
    configs = transformer_configs([gpt])  # NeMo RL holds a list of model chunks
    assert configs and all(c is gpt.config for c in configs)  # modules share one config
    gpt.config.fp8 = "e4m3"
    switch = Fp8ComputeSwitch()
    assert switch.set(gpt, enabled=False) == len(configs)
    assert switch.fp8_off and all(c.fp8 is None for c in configs)
    assert switch.set(gpt, enabled=False) == 0  # idempotent: the saved value stays "e4m3"
    tokens = torch.randint(0, 256, (2, 8))
    assert torch.isfinite(megatron_logits(gpt, tokens)).all()  # the BF16 forward runs
    assert switch.set(gpt, enabled=True) == len(configs)
    assert gpt.config.fp8 == "e4m3" and not switch.fp8_off
    assert switch.set(gpt, enabled=True) == 0
    gpt.config.fp8 = None


def test_fp8_parameters_have_no_bf16_reference(gpt) -> None:
    gpt.config.fp8, gpt.config.fp8_param = "e4m3", True
    try:
        with pytest.raises(RuntimeError, match="fp8_param: false"):
            Fp8ComputeSwitch().set(gpt, enabled=False)
        assert gpt.config.fp8 == "e4m3"  # nothing changed
    finally:
        gpt.config.fp8, gpt.config.fp8_param = None, False


def test_modules_without_config_are_ignored() -> None:
    assert transformer_configs(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []
