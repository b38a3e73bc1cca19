"""NeMo RL's block-scale rule (`nemo_quant.py` explains it), shared by the CPU and Triton paths."""

from __future__ import annotations

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448.0
BLOCK = 128


def nemo_scales(amax: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`(scale, scale_inv)` from per-block FP32 `amax`, by NeMo RL's rules (see `nemo_quant.py`).

    `amax` should be contiguous FP32 of NeMo RL's shape `(Mb, Nb, 1)` on the weight's device
    (`nemo_quant.py` says why shape and device matter for pow2).
    """
    if pow2:
        exponent = torch.ceil(torch.log2(amax / E4M3_MAX))
        biased = (torch.clamp(exponent, min=-127, max=127) + 127).to(torch.uint8)
        scale = torch.where(biased == 0, 1.0, torch.exp2(127 - biased.to(torch.float32)))
    else:
        scale = torch.reciprocal(amax) * E4M3_MAX
        scale = torch.where((amax == 0) | (amax == torch.inf), 1.0, scale)
    return scale, torch.reciprocal(scale)
