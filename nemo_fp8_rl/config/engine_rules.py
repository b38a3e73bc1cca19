"""Rules an engine enforces, checked when the recipe is loaded (not first on the node).

`async_grpo_issues`: what NeMo RL's `examples/run_grpo.py` refuses before it calls
`async_grpo_train`, and what `async_grpo_train` asserts at its start (the same lines in 7ea279a
and v0.7.0), for every recipe with `grpo.async_grpo.enabled` (the embedded engine runs no
asynchronous GRPO at all, so these hold for any engine). `nemo_engine_issues`: what the NeMo RL
engine (`engines/nemo/runner.check_recipe`) refuses, checked at load for GPU recipes, which
only that engine runs (a CPU recipe's engine is chosen at launch: its dry run and `submit`
check the chosen engine's rules). `recipes validate`, `show`, `train --dry-run` and `submit`
therefore refuse what the run would refuse.
"""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.mlflow_uri import FIX, store_kind
from nemo_fp8_rl.config.schema import source_of

# (key, value refused, where NeMo RL refuses it, fix)
ASYNC_REFUSED: tuple[tuple[str, Any, str, str], ...] = (
    (
        "grpo.use_dynamic_sampling",
        True,
        "examples/run_grpo.py",
        "set grpo.use_dynamic_sampling: false",
    ),
    (
        "grpo.reward_scaling.enabled",
        True,
        "examples/run_grpo.py",
        "set grpo.reward_scaling.enabled: false",
    ),
    (
        "grpo.reward_shaping.enabled",
        True,
        "examples/run_grpo.py",
        "set grpo.reward_shaping.enabled: false",
    ),
    (
        "data.use_multiple_dataloader",
        True,
        "examples/run_grpo.py",
        "set data.use_multiple_dataloader: false",
    ),
    (
        "policy.generation.vllm_cfg.async_engine",
        False,
        "async_grpo_train (should_use_async_rollouts)",
        "set it true (vLLM's async engine)",
    ),
    (
        "policy.generation.colocated.enabled",
        True,
        "async_grpo_train (colocated: Megatron generation only)",
        "set it false and give generation its nodes",
    ),
    (
        "loss_fn.use_importance_sampling_correction",
        False,
        "async_grpo_train",
        "set it true (TIS/icepop)",
    ),
)


def _get(config: dict, key: str) -> Any:
    value = lookup(config, key)
    return None if is_missing(value) else value


def is_async(config: dict) -> bool:
    """Whether the recipe runs NeMo RL's asynchronous GRPO."""
    return bool(_get(config, "grpo.async_grpo.enabled"))


def async_grpo_issues(config: dict, prov: dict[str, str]) -> list[Problem]:
    """What NeMo RL refuses for asynchronous GRPO, each with where it refuses and the fix."""
    if not is_async(config):
        return []
    backend = _get(config, "policy.generation.backend")
    skipped = {  # what NeMo RL asks only of some generation backends
        # should_use_async_rollouts: Megatron (and Dynamo) generation is always asynchronous
        "policy.generation.vllm_cfg.async_engine": backend not in (None, "vllm"),
        # async_grpo_train: colocated generation is refused unless it is Megatron's
        "policy.generation.colocated.enabled": backend == "megatron",
    }
    out = [
        Problem(
            key,
            f"{refused} is refused with grpo.async_grpo.enabled by NeMo RL's {where}",
            fix,
            source_of(prov, key),
        )
        for key, refused, where, fix in ASYNC_REFUSED
        if bool(_get(config, key)) == refused and not skipped.get(key, False)
    ]
    age = _get(config, "grpo.async_grpo.max_trajectory_age_steps") or 0
    if not isinstance(age, (int, float)) or age < 1:
        key = "grpo.async_grpo.max_trajectory_age_steps"
        out.append(
            Problem(
                key,
                "must be >= 1 for asynchronous GRPO",
                "set 1 (one step old, NeMo RL's async-1off recipes)",
                source_of(prov, key),
            )
        )
    return out


def nemo_engine_issues(config: dict, prov: dict[str, str]) -> list[Problem]:
    """What the NeMo RL engine cannot run, whatever the machine (its GPU checks aside)."""
    out = []
    calibrated = bool(_get(config, "loss_fn.calibration.enabled"))
    if calibrated and not _get(config, "policy.megatron_cfg.enabled"):
        out.append(
            Problem(
                "loss_fn.calibration.enabled",
                "needs the Megatron policy (policy.megatron_cfg.enabled: true): the BF16 shadow "
                "pass switches Megatron-Core's FP8 compute off",
                "set policy.megatron_cfg.enabled: true, or loss_fn.calibration.enabled: false",
                source_of(prov, "loss_fn.calibration.enabled"),
            )
        )
    graphs = _get(config, "policy.megatron_cfg.cuda_graph_impl")
    if calibrated and graphs not in (None, "none"):
        key = "policy.megatron_cfg.cuda_graph_impl"
        out.append(
            Problem(
                key,
                f"{graphs} with calibration: captured FP8 graphs would replay during the BF16 "
                "shadow pass",
                "set cuda_graph_impl: none",
                source_of(prov, key),
            )
        )
    if _get(config, "data_plane.enabled"):
        out.append(
            Problem(
                "data_plane.enabled",
                "the NeMo RL engine runs the legacy data path",
                "set it false",
                source_of(prov, "data_plane.enabled"),
            )
        )
    if _get(config, "refit.bridge") == "project":
        out.append(
            Problem(
                "refit.bridge",
                "project is not available on the NeMo RL engine yet",
                "use refit.bridge: nemo (NeMo RL's FP8 refit; power-of-2 weight scales via "
                "policy.generation.vllm_cfg.pow2_weight_scaling_factors: true)",
                source_of(prov, "refit.bridge"),
            )
        )
    return out


def mlflow_uri_issues(config: dict, prov: dict[str, str]) -> list[Problem]:
    """A `logger.mlflow.tracking_uri` MLflow cannot use (`mlflow_uri.store_kind`)."""
    uri = _get(config, "logger.mlflow.tracking_uri")
    if not _get(config, "logger.mlflow_enabled") or not isinstance(uri, str) or not uri:
        return []
    _, problem = store_kind(uri)
    key = "logger.mlflow.tracking_uri"
    return [] if problem is None else [Problem(key, problem, FIX, source_of(prov, key))]


def engine_rules(config: dict, prov: dict[str, str]) -> list[Problem]:
    """The rules checked at load (module docstring): async GRPO for every recipe, the NeMo RL
    engine's for GPU recipes, and the MLflow tracking URI's form."""
    out = async_grpo_issues(config, prov) + mlflow_uri_issues(config, prov)
    gpus = _get(config, "cluster.gpus_per_node")
    if isinstance(gpus, int) and gpus > 0:
        out += nemo_engine_issues(config, prov)
    return out
