"""What the guard checks read: the resolved recipe, the model's `config.json`, the NeMo RL tree
(the versions it pins, the source its rules are judged from) and the workers' GPU type.

NeMo RL's version string cannot tell its snapshots apart (main reported 0.6.0 long after v0.7.0
was tagged), so every rule that depends on NeMo RL is judged from its source or from the
versions its `pyproject.toml` pins, read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.gpus import GpuType
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.placement import on_cpu

VLLM = "policy.generation.vllm_cfg"
MCORE = "policy.megatron_cfg"
FP8_CFG = f"{MCORE}.fp8_cfg"


def get_key(cfg: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """`cfg`'s value at `dotted` (`default` when absent or null); no interpolation."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """`0.25.1` -> (0, 25, 1); None when `text` has no leading number."""
    parts: list[int] = []
    for piece in (text or "").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def _pinned(text: str, pattern: str) -> str | None:
    found = re.findall(pattern, text)
    return found[0] if found else None


@dataclass(frozen=True)
class NemoRLTree:
    """A NeMo RL source tree and the versions its pyproject.toml pins (None: not found)."""

    path: Path | None
    vllm: str | None = None
    transformer_engine: str | None = None

    @classmethod
    def read(cls, path: Path | None) -> NemoRLTree:
        if path is None or not (path / "pyproject.toml").is_file():
            return cls(path)
        text = (path / "pyproject.toml").read_text(encoding="utf-8")
        return cls(
            path,
            _pinned(text, r"\bvllm==([0-9][0-9a-z.]*)"),
            _pinned(text, r"TransformerEngine\.git@(?:release_)?v?([0-9][0-9.]*)"),
        )

    def source(self, rel: str) -> str | None:
        """The text of NeMo RL file `rel` (None when the tree or the file is absent)."""
        if self.path is None or not (self.path / rel).is_file():
            return None
        return (self.path / rel).read_text(encoding="utf-8")

    def describe(self) -> str:
        if self.path is None:
            return "no NeMo RL tree"
        return f"NeMo RL at {self.path} (pins vLLM {self.vllm}, Transformer Engine {self.transformer_engine})"


@dataclass(frozen=True)
class WorkerGpu:
    """The workers' GPU type and how it was learnt (`--gpu`, `slurm.gpu`, the partition)."""

    gpu: GpuType
    how: str


@dataclass
class GuardContext:
    """Everything a check reads (module docstring)."""

    config: dict[str, Any]
    provenance: dict[str, str] = field(default_factory=dict)
    hf: dict[str, Any] | None = None  # the model's config.json
    nemo_rl: NemoRLTree = field(default_factory=lambda: NemoRLTree(None))
    worker: WorkerGpu | None = None
    recipe_path: Path | None = None

    def get(self, key: str, default: Any = None) -> Any:
        value = lookup(self.config, key)
        return default if is_missing(value) or value is None else value

    # ---- the recipe's precision, as the checks name it ---------------------------------------
    @property
    def fp8_training(self) -> bool:
        return bool(self.get(f"{FP8_CFG}.enabled")) and bool(self.get(f"{MCORE}.enabled"))

    @property
    def fp8_recipe(self) -> str | None:
        return self.get(f"{FP8_CFG}.fp8_recipe", "blockwise") if self.fp8_training else None

    @property
    def fp8_rollout(self) -> bool:
        return self.get(f"{VLLM}.precision") == "fp8"

    @property
    def kv_fp8(self) -> bool:
        return str(self.get(f"{VLLM}.kv_cache_dtype", "auto")).startswith("fp8")

    @property
    def is_mx(self) -> bool:
        return self.fp8_rollout and bool(self.get(f"{VLLM}.is_mx"))

    @property
    def on_gpu(self) -> bool:
        return not on_cpu(self.config)

    def megatron_env(self, name: str, default: str = "0") -> str:
        env = self.get(f"{MCORE}.env_vars") or {}
        return str(env.get(name, default))

    def vllm_env(self, name: str) -> str | None:
        env = self.get(f"{VLLM}.env_vars") or {}
        return None if name not in env else str(env[name])
