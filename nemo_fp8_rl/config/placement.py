"""Where a recipe runs: on this machine's CPUs or on GPUs, decided by one setting.

`cluster.gpus_per_node: 0` places a run on CPU (the embedded engine, or NeMo RL's loop on CPU
with `--engine nemo`); any other value, on GPUs. Every question "does this recipe run on CPU?"
is asked here, and a run records the answer in its `environment.json` (`placement`), so that
readers of a finished run (`evals`) need not guess it from the files it left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CPU, GPU = "cpu", "gpu"


def on_cpu(config: Mapping[str, Any]) -> bool:
    """Whether a recipe's config runs on CPU (`cluster.gpus_per_node: 0`); a config without the
    key (a partial one) counts as GPU."""
    return (config.get("cluster") or {}).get("gpus_per_node") == 0


def placement(config: Mapping[str, Any]) -> str:
    """`cpu` or `gpu`, as `environment.json` records it."""
    return CPU if on_cpu(config) else GPU
