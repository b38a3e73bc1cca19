"""The config.json `refit export` writes names one dtype (`refit.export.engine_config`)."""

from __future__ import annotations

from nemo_fp8_rl.refit import RefitPlan
from nemo_fp8_rl.refit.export import engine_config


def test_exported_config_names_one_dtype():
    """A config written by transformers 5 (`dtype: float32`, the tiny model's) gets bfloat16 under
    both names, so `dtype` and `torch_dtype` never contradict each other."""
    written = engine_config({"model_type": "qwen3", "dtype": "float32"}, RefitPlan(scheme="block"))
    assert written["dtype"] == written["torch_dtype"] == "bfloat16"
    assert written["quantization_config"]["quant_method"] == "fp8"
