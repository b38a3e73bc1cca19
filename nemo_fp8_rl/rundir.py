"""The run directory, for every engine: the resolved recipe and environment saved with the run,
and a guard that refuses to overwrite a different recipe's run."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

# Keys that may differ between a run and its resumption (run length, logging, output places).
RESUMABLE_KEYS = (
    "grpo.max_num_steps",
    "grpo.val_at_end",
    "checkpointing.save_period",
    "checkpointing.keep_top_k",
    "checkpointing.checkpoint_dir",
    "logger.log_dir",
    "local.progress",
)


class RunDirError(RuntimeError):
    """The run directory holds something this run must not overwrite."""


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two resolved configs (resumable keys ignored)."""
    a, b = _flatten(saved), _flatten(current)
    keys = sorted(set(a) | set(b))
    ignored = tuple(RESUMABLE_KEYS)
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in keys
        if a.get(k) != b.get(k) and not k.startswith(ignored)
    ]


def _json_roundtrip(config: dict) -> dict:
    """The config as it reads back from YAML (tuples become lists, etc.)."""
    return yaml.safe_load(yaml.safe_dump(config, sort_keys=False))


def check_owner(run_dir: Path, config: dict) -> None:
    """Refuse a `run_dir` that holds a run of another recipe (or of this recipe with different
    settings), or outputs with no `recipe.yaml` to check against; the message lists the
    differences and how to proceed. Nothing is written."""
    saved_path = run_dir / "recipe.yaml"
    if saved_path.exists():
        saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
        diffs = config_differences(saved, _json_roundtrip(config))
        if diffs:
            saved_name = saved.get("logger", {}).get("wandb", {}).get("name")
            shown = "\n  ".join(diffs[:20]) + ("\n  ..." if len(diffs) > 20 else "")
            raise RunDirError(
                f"{run_dir} already holds a run of recipe {saved_name!r} with different settings:"
                f"\n  {shown}\nNothing was overwritten. Pass --run-dir to write elsewhere, or "
                f"delete {run_dir} to start over."
            )
    elif any((run_dir / x).exists() for x in ("checkpoints", "metrics.jsonl", "logs")):
        raise RunDirError(
            f"{run_dir} holds a run without a recipe.yaml, so it cannot be checked against this "
            f"recipe; nothing was overwritten. Pass --run-dir to write elsewhere, or delete {run_dir}."
        )


def prepare(run_dir: Path, config: dict, recipe_yaml: str, *, resume: bool) -> None:
    """`check_owner`, then clear a previous run of the same recipe unless resuming, and write
    `recipe_yaml` (the resolved recipe) as `recipe.yaml`."""
    check_owner(run_dir, config)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in ("checkpoints", "logs", "metrics.jsonl"):
            path = run_dir / stale
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    atomic_write(run_dir / "recipe.yaml", recipe_yaml)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (never a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def write_environment(run_dir: Path, engine: str, extra: dict[str, Any]) -> None:
    """Record engine, versions, host and threads (plus `extra`) in `environment.json`."""
    import torch

    env = {
        "engine": engine,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            d: _version(d)
            for d in ("nemo-fp8-rl", "torch", "transformers", "tokenizers", "ray", "pydantic")
        },
        "env": {k: os.environ[k] for k in ("RAY_ADDRESS", "SLURM_JOB_ID") if k in os.environ},
        **extra,
    }
    atomic_write(run_dir / "environment.json", json.dumps(env, indent=1, default=str) + "\n")
