"""What the NeMo RL in use must do for an MXFP8 rollout (`vllm_cfg.is_mx`), read from its source.

Two settings pass every config check and still do not run as the recipe says:

* `is_mx` on a NeMo RL that does not read it (v0.7.0: its `init_fp8` never looks at the key and
  builds vLLM with 128x128 block FP8, and its refit quantizes block FP8): the run would serve
  block FP8 (with the recipe's power-of-2 scales), not MXFP8, silently;
* `is_mx` on an MoE model with `vllm_kwargs.moe_backend` other than `auto` or
  `flashinfer_trtllm`: 7ea279a's MXFP8 MoE refit converts only FlashInfer TRTLLM's layout
  (`process_weights_after_loading_mxfp8_moe` raises NotImplementedError at the first refit);
  `auto` picks FlashInfer TRTLLM first on Blackwell (vLLM's MXFP8 MoE oracle).

`mx_problems` finds both; the engine refuses them before anything starts (`runner`), and the
preflight reports them located in NeMo RL's file (`preflight`). Reads files only (no import).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.user_error import Problem

FP8_FILE = "nemo_rl/models/generation/vllm/quantization/fp8.py"
READS_IS_MX = 'vllm_cfg.get("is_mx")'
INIT_FP8 = "def init_fp8("
MOE_ONLY_TRTLLM = "MXFP8 MoE refit layout conversion only supports FLASHINFER_TRTLLM"
MOE_BACKENDS_OK = ("auto", "flashinfer_trtllm")
VLLM = "policy.generation.vllm_cfg"


def _line(lines: list[str], text: str) -> int:
    return next((i for i, line in enumerate(lines, 1) if text in line), 0)


def mx_problems(
    config: Mapping[str, Any], tree: Path, num_experts: int | None = None
) -> list[Problem]:
    """The module docstring's refusals for `config` against the NeMo RL tree `tree` (the folder
    holding `nemo_rl/`); `num_experts` from the model's config (None: the MoE rule is skipped)."""
    gen = (config.get("policy") or {}).get("generation") or {}
    vllm = gen.get("vllm_cfg") or {}
    if not (vllm.get("precision") == "fp8" and vllm.get("is_mx")):
        return []
    path = Path(tree) / FP8_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    source = "\n".join(lines)
    if READS_IS_MX not in source:
        return [
            Problem(
                f"{VLLM}.is_mx",
                "this NeMo RL does not read is_mx (v0.7.0): its init_fp8 builds vLLM with "
                "128x128 block FP8 and its refit quantizes block FP8, so the run would serve "
                "block FP8, not MXFP8",
                "run NeMo RL main 7ea279a or later, or a recipe without is_mx (the Hopper "
                "sibling on Hopper GPUs)",
                FP8_FILE,
                _line(lines, INIT_FP8),
            )
        ]
    backend = (gen.get("vllm_kwargs") or {}).get("moe_backend", "auto")
    if num_experts and backend not in MOE_BACKENDS_OK and MOE_ONLY_TRTLLM in source:
        return [
            Problem(
                "policy.generation.vllm_kwargs.moe_backend",
                f"{backend!r} with MXFP8 experts: NeMo RL's MXFP8 MoE refit converts only "
                "FlashInfer TRTLLM's weight layout (NotImplementedError at the first refit)",
                "set policy.generation.vllm_kwargs.moe_backend: flashinfer_trtllm (or auto)",
                FP8_FILE,
                _line(lines, MOE_ONLY_TRTLLM),
            )
        ]
    return []


def num_experts(hf_config: Mapping[str, Any]) -> int:
    """Routed experts per MoE layer of an HF config (0: dense)."""
    return int(hf_config.get("num_experts") or hf_config.get("n_routed_experts") or 0)
