"""Bytes one refit sends, trainer-side FP8 pairs against the BF16 refit, from a model config.

`wire_bytes(config)` walks the model's HF tensors (`hf_shapes`, no weights) through NeMo RL's FP8
layout (`NemoFp8Layout`): with `refit.quantize_on: trainer` each FP8 weight travels as E4M3 plus
FP32 block scales (with `mx=True`, NeMo RL's `is_mx`: E4M3 plus one uint8 E8M0 byte per 1x32
block), everything else as BF16; with `generator` (NeMo RL's default) everything
travels as BF16 and vLLM quantizes on arrival. MLA models (DeepSeek-V3 architecture) keep their
low-rank projections BF16 as their recipes do (`quantization_ignored_layer_kws: [a_proj, b_proj]`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from nemo_fp8_rl.refit.hf_shapes import hf_weight_shapes, is_mla
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules

MLA_IGNORED = ("a_proj", "b_proj")


def wire_bytes(config: Mapping[str, Any], *, mx: bool = False) -> tuple[int, int, float]:
    """`(trainer, generator)` bytes of one refit of the whole model, and the trainer/generator
    ratio over the FP8 weights alone (their E4M3 + scales against their BF16); `mx`: MXFP8."""
    shapes = dict(hf_weight_shapes(config))
    ignored = MLA_IGNORED if is_mla(config) else ()
    rules = NemoFp8Rules(num_layers=config["num_hidden_layers"], ignored_keywords=ignored, mx=mx)
    layout = NemoFp8Layout(shapes, rules)
    trainer = generator = fp8_trainer = fp8_generator = 0
    for name, shape in shapes.items():
        sent = sum(
            math.prod(s) * dtype.itemsize
            for _, s, dtype in layout.planned(name, shape, torch.bfloat16)
        )
        trainer, generator = trainer + sent, generator + 2 * math.prod(shape)
        if layout.is_fp8(name):
            fp8_trainer, fp8_generator = fp8_trainer + sent, fp8_generator + 2 * math.prod(shape)
    return trainer, generator, fp8_trainer / fp8_generator
