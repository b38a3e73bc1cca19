"""Which fused layers of a model vLLM cannot serve in block FP8 through NeMo RL's refit.

vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` and keeps one 128x128 block
scale grid per fused weight; NeMo RL's refit loads each part's weight and its scales
(`weight_scale_inv`, ceil(rows / 128) rows of blocks) into that grid at the part's offset in
blocks. A part whose output size is not a multiple of 128 has a partial last block, so the next
part's offset overruns the grid. Measured on vLLM 0.25.1 (CPU build) with the tiny Qwen3 (q 128,
k and v 64 wide): the first refit fails in `load_qkv_weight` ("start (2) + length (1) exceeds
dimension size (2)"). Real models' parts are multiples of 128 (8 KV heads of 128).

`misfit_keywords` names those parts as `vllm_cfg.quantization_ignored_layer_kws` keywords (NeMo
RL's `init_fp8` then keeps them in BF16, and the trainer-side FP8 refit follows the same list).
"""

from __future__ import annotations

import json
from pathlib import Path

BLOCK = 128
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")


def misfit_keywords(config: dict) -> list[str]:
    """Keywords of the fused parts of a Hugging Face `config` that are not a whole number of
    128-row blocks (empty: every fused layer can be served in block FP8)."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    out: list[str] = []
    if (heads * head_dim) % BLOCK or (kv * head_dim) % BLOCK:
        out += QKV
    if int(config["intermediate_size"]) % BLOCK:
        out += GATE_UP
    return out


def model_misfits(model_dir: str | Path) -> list[str]:
    """`misfit_keywords` of the checkpoint folder's `config.json`."""
    return misfit_keywords(json.loads((Path(model_dir) / "config.json").read_text()))
