"""Versions NeMo RL's `pyproject.toml` pins, for the checks that follow the pinned library.

vLLM and Transformer Engine are absent on CPU, so `vllm_checks` cites vLLM's lines for the vLLM
version NeMo RL pins, and `megatron_checks` answers megatron-core's TE version query with the TE
version it pins; both read the pins here.
"""

from __future__ import annotations

import re
from pathlib import Path


def pinned_versions(nemo_rl_tree: Path, *patterns: str) -> list[str]:
    """Every version the patterns capture (group 1) in NeMo RL's pyproject.toml, pattern by
    pattern in file order; [] when the tree has no pyproject.toml."""
    path = nemo_rl_tree / "pyproject.toml"
    text = path.read_text() if path.is_file() else ""
    return [found for pattern in patterns for found in re.findall(pattern, text)]
