"""Where warm-up results live: shipped starting policies, and the per-machine cache.

A warm-up is a few hundred AdamW steps in FP32 on the CPU. Its numerics depend on the machine:
PyTorch picks its CPU kernels by instruction set (AVX2, AVX-512, ...), and the order in which a
kernel sums differs between them and with the thread count, so the same seed can cross the
accuracy band 20 steps earlier on another machine and start GRPO from another policy. Two
stores keep that from moving results:

- **shipped** (`data/warmup/<config key>/` in the repository, or `$NEMO_FP8_RL_WARMUPS`):
  starting policies committed with the project, keyed by the configuration only
  (`config_key`: model, the task settings the warm-up reads (`WARMUP_TASK_FIELDS`), warm-up
  settings, seed, vocabulary). When one exists it is used on every machine, so the starting
  policy is the same bytes everywhere. Task settings the warm-up never reads (the GRPO
  validation split's size, the GRPO training stream's seed) are not in the key: recipes that
  differ only there share one warm-up.
- **cache** (`$NEMO_FP8_RL_CACHE/warmup` or `~/.cache/nemo_fp8_rl/warmup`, `<cache key>/`):
  warm-ups computed here, keyed by the configuration *and* the machine numerics that change
  the result (`key_numerics()`: CPU instruction set, thread count, machine architecture), so
  a cache built on one machine or with one thread count is never mistaken for another's.
  PyTorch's version is recorded (`numerics()`, in `meta.json`) but not in the key: the project's
  environment and NeMo RL's (another torch) then share a warm-up instead of training it twice.
  That is as safe as the shipped store, which serves the same bytes under every torch: a
  cached warm-up is a warm-up of this configuration, and the run records what built it.

Each entry is `model.safetensors` (the untied FP32 state) and `meta.json` (steps, held-out
accuracy checks, final loss, and the numerics it was built with).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.config.safe_files import located_disk_full, write_atomic

KEY_VERSION = 3
# the task settings the warm-up reads (`warmup.train_warmup`, `warmup.warmup_eval_problems`)
WARMUP_TASK_FIELDS = ("name", "digits", "validation_seed")
REPO_ROOT = Path(__file__).resolve().parents[2]


def shipped_root() -> Path:
    """Shipped warm-ups: `$NEMO_FP8_RL_WARMUPS`, else the repository's `data/warmup`."""
    return Path(os.environ.get("NEMO_FP8_RL_WARMUPS") or REPO_ROOT / "data" / "warmup")


def cache_root() -> Path:
    """Computed warm-ups: `$NEMO_FP8_RL_CACHE/warmup` or `~/.cache/nemo_fp8_rl/warmup`."""
    base = os.environ.get("NEMO_FP8_RL_CACHE") or Path.home() / ".cache" / "nemo_fp8_rl"
    return Path(base) / "warmup"


def numerics() -> dict[str, Any]:
    """What changes a warm-up's floating-point result on the same configuration."""
    return {
        "torch": torch.__version__.split("+")[0],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def key_numerics() -> dict[str, Any]:
    """The part of `numerics()` in the cache key (module docstring: torch's version is not)."""
    return {k: v for k, v in numerics().items() if k != "torch"}


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def config_key(local: LocalConfig, seed: int, vocab: dict[str, int]) -> str:
    """Hash of the configuration that defines a warm-up (the shipped store's key)."""
    return _digest(
        {
            "version": KEY_VERSION,
            "model": local.model.model_dump(),
            "task": {k: getattr(local.task, k) for k in WARMUP_TASK_FIELDS},
            "warmup": local.warmup.model_dump(),
            "seed": seed,
            "vocab": sorted(vocab.items()),
        }
    )


def cache_key(local: LocalConfig, seed: int, vocab: dict[str, int]) -> str:
    """Hash of the configuration and this process's `key_numerics()` (the cache's key)."""
    return _digest({"config": config_key(local, seed, vocab), "numerics": key_numerics()})


def lookup(local: LocalConfig, seed: int, vocab: dict[str, int]) -> tuple[Path, str]:
    """The folder of the warm-up to use and its origin, `shipped` or `cache`.

    The shipped one wins when it exists; otherwise the cache folder (which may not exist yet).
    """
    shipped = shipped_root() / config_key(local, seed, vocab)
    if (shipped / "model.safetensors").exists():
        return shipped, "shipped"
    return cache_root() / cache_key(local, seed, vocab), "cache"


def save(folder: Path, state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write `model.safetensors` and `meta.json` into `folder`, each swapped in whole."""
    folder.mkdir(parents=True, exist_ok=True)
    with (
        located_disk_full(folder, "nothing was written (the warm-up is computed again next time)"),
        tempfile.TemporaryDirectory(dir=folder) as tmp,
    ):
        save_file(state, Path(tmp) / "model.safetensors")  # safe-write: private
        write_atomic(Path(tmp) / "meta.json", json.dumps(meta, indent=1) + "\n")
        for name in ("model.safetensors", "meta.json"):  # readable like any checkpoint
            os.chmod(Path(tmp) / name, 0o644)
        os.replace(Path(tmp) / "meta.json", folder / "meta.json")  # safe-write: rename
        os.replace(
            Path(tmp) / "model.safetensors", folder / "model.safetensors"
        )  # safe-write: rename
