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
from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.schema import PROJECT_SECTIONS
from nemo_fp8_rl.config.user_error import USAGE, ProblemsError

HANDOFF_FILE = "nemo_rl_config.yaml"


class HandoffError(ProblemsError, ValueError):
    """The hand-off config is not accepted by NeMo RL; the message lists each key and the fix."""

    code = USAGE
    limit = 50  # listed; the rest counted


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
            lines.append(f"{key}: {err['msg']} (got {shown[:80]})")
        raise HandoffError(
            "NeMo RL's MasterConfig",
            f"rejects the hand-off config ({len(lines)} problem(s))",
            lines,
            "change the recipe keys above (or the base config configs/base/grpo.yaml); NeMo RL's "
            "own names and types apply",
        ) from None


def write_handoff(recipe: Recipe, run_dir: Path, config: dict[str, Any] | None = None) -> Path:
    """Write `nemo_rl_config.yaml` (the hand-off, or `config` where the engine changed it)
    into `run_dir`; returns its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / HANDOFF_FILE
    header = (
        f"# NeMo RL master config for {recipe.name}, generated from {recipe.path.name}\n"
        "# (the recipe minus the sections this project owns). Regenerate; do not edit.\n"
    )
    handed = to_nemo_config(recipe) if config is None else config
    body = yaml.safe_dump(handed, sort_keys=False, default_flow_style=False)
    write_atomic(path, header + body)
    return path


# Keys of NeMo RL's exemplar configs (`grpo_math_1B.yaml`, `grpo_math_1B_megatron.yaml` and the FP8
# recipes under `examples/configs/recipes/llm/`) that the hand-off deliberately leaves out. A key
# matches itself and everything under it. Everything else an exemplar has must be in every GPU
# recipe's hand-off (tests/test_nemo_contract.py holds the two together), so a key NeMo RL adds
# later fails a test instead of a job on a cluster.
LEFT_OUT: dict[str, str] = {
    # The DTensor (PyTorch FSDP2) policy is off; on the Megatron path NeMo RL reads only
    # `policy.dtensor_cfg.enabled` (false here), as in grpo_math_1B_megatron.yaml.
    "policy.dtensor_cfg": "DTensor backend off (enabled: false); its settings are never read",
    # The torch optimizer/scheduler of the DTensor path; Megatron uses megatron_cfg.optimizer and
    # megatron_cfg.scheduler. grpo_math_1B_megatron.yaml sets both to null, as the base does.
    "policy.optimizer": "DTensor-only torch optimizer; null on the Megatron path",
    "policy.scheduler": "DTensor-only torch scheduler; null on the Megatron path",
    # Megatron-Core inference settings, read only with policy.generation.backend: megatron (we
    # generate with vLLM). Their defaults also differ between releases (refit_backend: nvshmem
    # in v0.7.0, nccl at main), so a fixed copy would be wrong for one of them.
    "policy.generation.mcore_generation_config": "generation.backend megatron only (we use vllm)",
    # Read with .get(); absent, each NeMo RL release uses its own port plan (TCPStore ports
    # 25000-28000 in v0.7.0, 1400-1999 at main; generation 11001-15000 vs 3000-4999). A copy of
    # one release's numbers would put the other's ports in the wrong band.
    "cluster.master_port_range_low": "version-specific default; NeMo RL falls back when absent",
    "cluster.master_port_range_high": "version-specific default; NeMo RL falls back when absent",
    "policy.generation.port_range_low": "version-specific default; read with .get()",
    "policy.generation.port_range_high": "version-specific default; read with .get()",
    # Vision-language models only (Qwen3.5 recipe); read with .get().
    "policy.megatron_cfg.freeze_config": "vision-language models only; read with .get()",
    # Free-form maps whose entries in individual exemplar recipes are model- or version-specific
    # workarounds (Qwen3.5's RayExecutorV2 switch and allocator setting, the 20 GiB KV-cache budget
    # of the Llama FP8-rollout recipe); a recipe adds them when it needs them.
    "policy.generation.vllm_cfg.env_vars": "free-form; per-recipe workarounds",
    "policy.megatron_cfg.env_vars": "free-form; per-recipe workarounds",
    "policy.generation.vllm_kwargs": "free-form; per-recipe vLLM arguments",
    # The task: which data sets and environments a recipe uses is its own choice (the Qwen3-8B
    # recipes use DAPOMath17K with an AIME validation set and a `dapo` environment, the others
    # OpenMathInstruct-2 with a validation split of the training set and `math` only).
    "data.validation": "the recipe's choice (null: split off data.train)",
    "env": "one entry per environment the recipe's data names",
}


def left_out_reason(key: str) -> str | None:
    """The allow-list reason covering dotted `key` (itself or a parent), or None."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        reason = LEFT_OUT.get(".".join(parts[:i]))
        if reason is not None:
            return reason
    return None
