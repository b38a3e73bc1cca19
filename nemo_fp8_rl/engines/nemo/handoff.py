"""The config hand-off: a resolved recipe becomes the NeMo RL master config the run uses.

A recipe is a NeMo RL GRPO master config plus sections this project owns (`local`, `refit`,
`slurm`, `loss_fn.calibration`). NeMo RL never reads those, so the hand-off removes them; every
other key passes through unchanged, with the paths already derived from the recipe name. The
result is written to the run directory (`nemo_rl_config.yaml`) so a run can be re-created with
NeMo RL alone, and validated by NeMo RL's own `MasterConfig` where NeMo RL is importable.

The project's sections still reach the run: the engine builds the loss from the recipe's
`loss_fn` section (calibration included) and reads `refit` itself.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.schema import PROJECT_SECTIONS

HANDOFF_FILE = "nemo_rl_config.yaml"


class HandoffError(ValueError):
    """The hand-off config is not accepted by NeMo RL; the message lists each key and the fix."""


def to_nemo_config(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe minus the project's own sections (a deep copy; the recipe is untouched)."""
    config = copy.deepcopy(recipe.config)
    config.pop("defaults", None)
    for dotted in PROJECT_SECTIONS:
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return config


def _loc_to_key(loc: tuple[Any, ...]) -> str:
    """pydantic error location -> dotted key (drops union-branch tags such as `MegatronConfig`)."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and p[:1].isupper())]
    return ".".join(parts)


def validate_with_nemo_rl(config: dict[str, Any]) -> Any:
    """Build NeMo RL's `MasterConfig` from `config`; HandoffError lists every rejected key.

    Imports NeMo RL (v0.7.0+, where `MasterConfig` is a pydantic model); the caller decides
    whether NeMo RL is present. Returns the `MasterConfig` instance `grpo_train` expects.
    """
    from nemo_rl.algorithms.grpo import MasterConfig
    from pydantic import ValidationError

    try:
        return MasterConfig(**copy.deepcopy(config))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            if any(isinstance(p, str) and p.endswith("Disabled") for p in err["loc"]):
                continue  # the `enabled: false` branch of a union; the enabled branch says more
            key = _loc_to_key(err["loc"])
            got = err.get("input")
            shown = repr(got) if not isinstance(got, dict) else "{...}"
            lines.append(f"  - {key}: {err['msg']} (got {shown[:80]})")
        raise HandoffError(
            f"NeMo RL's MasterConfig rejects the hand-off config ({len(lines)} problem(s)):\n"
            + "\n".join(lines)
            + "\nFix the recipe keys above (or the base config configs/base/grpo.yaml); "
            "NeMo RL's own names and types apply."
        ) from None


def write_handoff(recipe: Recipe, run_dir: Path) -> Path:
    """Write `nemo_rl_config.yaml` (the hand-off) into `run_dir`; returns its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / HANDOFF_FILE
    header = (
        f"# NeMo RL master config for {recipe.name}, generated from {recipe.path.name}\n"
        "# (the recipe minus the sections this project owns). Regenerate; do not edit.\n"
    )
    body = yaml.safe_dump(to_nemo_config(recipe), sort_keys=False, default_flow_style=False)
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(header + body)
    tmp.replace(path)
    return path
