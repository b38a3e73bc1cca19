"""Schema of a resolved recipe: known keys, types, ranges and choices.

NeMo RL's own sections are checked against the complete base config (`configs/base/grpo.yaml`):
every key must exist there (a misspelt key is an error with a did-you-mean, not silently ignored as
in NeMo RL), and its value must have the base value's type. A base value of `null` accepts any
value; a few sections are free-form by design (`OPEN`). Ranges and choices for the keys that matter
are in `RANGES`/`CHOICES`. Project-owned sections are validated by their pydantic models.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.nemo_rl_keys import (
    NEMO_RL_KEYS,
    NULLABLE_IN_NEMO_RL,
    WIDER_TYPES,
    nemo_rl_type_ok,
)
from nemo_fp8_rl.config.project import (
    AblationConfig,
    CalibrationConfig,
    HealthConfig,
    LocalConfig,
    RefitConfig,
    SlurmConfig,
)

# Sections whose keys are free-form (NeMo RL passes them through to another library).
OPEN = (
    "env",
    "policy.hf_config_overrides",
    "policy.megatron_cfg.model_overrides",
    "policy.megatron_cfg.env_vars",
    "policy.generation.vllm_kwargs",
    "policy.generation.vllm_cfg.env_vars",
    "logger.tensorboard",
    "slurm.env",
    "health.limits",
)
# Keys NeMo RL reads only when present (its own default applies when absent), which the base
# leaves out so that a recipe without them gets NeMo RL's behaviour: key -> type when set.
ABSENT_BY_DEFAULT: dict[str, type] = {
    # megatron/setup.py: `if "moe_grouped_gemm" in config["megatron_cfg"]`, else the model
    # provider's value (NeMo RL's DeepSeek-V3 recipes set it).
    "policy.megatron_cfg.moe_grouped_gemm": bool,
    # megatron/train.py: `.get("fuse_loss", False)`; one packed loss call per micro-batch.
    "policy.sequence_packing.fuse_loss": bool,
    # utils/logger.py: `WandbConfig.entity` (NotRequired), the W&B team or user of the run.
    "logger.wandb.entity": str,
}
# Keys derived from the recipe name and --run-dir. The run name keys are never written by hand;
# the two output paths (`PATH_KEYS`) are derived unless a recipe or override sets them, as NeMo
# RL's own configs do (the NeMo RL engine then writes there; the embedded engine refuses them).
PATH_KEYS = ("logger.log_dir", "checkpointing.checkpoint_dir")
DERIVED = (
    "logger.log_dir",
    "checkpointing.checkpoint_dir",
    "logger.wandb.name",
    "logger.swanlab.name",
    "logger.mlflow.run_name",
)

PROJECT_SECTIONS: dict[str, type[BaseModel]] = {
    "loss_fn.calibration": CalibrationConfig,
    "loss_fn.ablation": AblationConfig,
    "local": LocalConfig,
    "refit": RefitConfig,
    "slurm": SlurmConfig,
    "health": HealthConfig,
}


def _ge(lo: float) -> Callable[[float], bool]:
    return lambda v: v >= lo


def _gt(lo: float) -> Callable[[float], bool]:
    return lambda v: v > lo


def _top_k(v: Any) -> bool:
    """NeMo RL's vLLM check: None or -1 disable top-k filtering, otherwise >= 1 (0 is refused)."""
    return v is None or v == -1 or v >= 1


# Keys whose base value is null but which hold a number (or null) when set.
NULLABLE: dict[str, tuple[type, ...]] = {
    "grpo.advantage_clip_low": (int, float),
    "grpo.advantage_clip_high": (int, float),
    "grpo.stop_at_validation_threshold": (int, float),
    "grpo.reward_shaping.stop_properly_penalty_coef": (int, float),
    "grpo.seq_logprob_error_threshold": (int, float),
    "grpo.invalid_tool_call_advantage": (int, float),
    "grpo.malformed_thinking_advantage": (int, float),
    "loss_fn.ratio_clip_c": (int, float),
    "loss_fn.truncated_importance_sampling_ratio_min": (int, float),
    "policy.logprob_chunk_size": (int,),
    "policy.generation.top_k": (int,),
    "policy.generation.val_top_k": (int,),
    "policy.megatron_cfg.num_layers_in_first_pipeline_stage": (int,),
    "policy.megatron_cfg.num_layers_in_last_pipeline_stage": (int,),
    "policy.generation.colocated.resources.gpus_per_node": (int,),
    "policy.generation.colocated.resources.num_nodes": (int,),
}
# Seeds: NeMo RL's `set_seed` seeds numpy, which takes 0 <= seed < 2**32.
SEED_LIMIT = 2**32

RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "grpo.seed": (lambda v: 0 <= v < SEED_LIMIT, "in [0, 2**32) (NeMo RL seeds numpy with it)"),
    "grpo.num_prompts_per_step": (_ge(1), ">= 1"),
    "grpo.num_generations_per_prompt": (_ge(2), ">= 2 (group advantages need two samples)"),
    "grpo.max_num_steps": (_ge(1), ">= 1"),
    "grpo.val_period": (_ge(0), ">= 0 (0 disables validation)"),
    "policy.train_global_batch_size": (_ge(1), ">= 1"),
    "policy.train_micro_batch_size": (_ge(1), ">= 1"),
    "policy.max_total_sequence_length": (_ge(1), ">= 1"),
    "policy.max_grad_norm": (_gt(0), "> 0"),
    "policy.generation.max_new_tokens": (_ge(1), ">= 1"),
    "policy.generation.temperature": (_gt(0), "> 0"),
    "policy.generation.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "policy.generation.val_temperature": (_gt(0), "> 0"),
    "policy.generation.val_top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "policy.generation.top_k": (_top_k, "-1 or null (no top-k filtering) or >= 1"),
    "policy.generation.val_top_k": (_top_k, "-1 or null (no top-k filtering) or >= 1"),
    "policy.generation.vllm_cfg.gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "policy.megatron_cfg.optimizer.lr": (_gt(0), "> 0"),
    "policy.megatron_cfg.optimizer.min_lr": (_ge(0), ">= 0"),
    "policy.megatron_cfg.tensor_model_parallel_size": (_ge(1), ">= 1"),
    "policy.megatron_cfg.pipeline_model_parallel_size": (_ge(1), ">= 1"),
    "policy.megatron_cfg.expert_model_parallel_size": (_ge(1), ">= 1"),
    "loss_fn.ratio_clip_min": (
        lambda v: 0 < v <= 1,
        "in (0, 1]: the lower bound is 1 - ratio_clip_min (1: no lower bound, as NeMo RL allows)",
    ),
    "loss_fn.ratio_clip_max": (_gt(0), "> 0: the upper bound is 1 + ratio_clip_max"),
    "loss_fn.reference_policy_kl_penalty": (_ge(0), ">= 0"),
    "cluster.num_nodes": (_ge(1), ">= 1"),
    # Settings where 0 does nothing or the wrong thing in NeMo RL: a save every 0 steps is a
    # modulo by zero, keep_top_k 0 keeps no checkpoint, a generation or
    # logprob batch of 0 samples nothing, a math environment of 0 workers never scores.
    "checkpointing.save_period": (_ge(1), ">= 1 (set checkpointing.enabled: false to save none)"),
    "checkpointing.keep_top_k": (_ge(1), ">= 1 (0 would keep no checkpoint)"),
    "policy.generation_batch_size": (_ge(1), ">= 1"),
    "policy.logprob_batch_size": (_ge(1), ">= 1"),
    "env.math.num_workers": (_ge(1), ">= 1 (the math verifier's workers score every sample)"),
    "cluster.gpus_per_node": (_ge(0), ">= 0 (0 runs the embedded CPU engine)"),
}

CHOICES: dict[str, tuple[Any, ...]] = {
    "policy.precision": ("bfloat16", "float16", "float32"),
    # NeMo RL's generation backends (GenerationConfig); the FP8 rollout overlays are vLLM's.
    "policy.generation.backend": ("vllm", "megatron", "sglang", "trtllm", "dynamo"),
    "policy.generation.vllm_cfg.precision": ("bfloat16", "float16", "float32", "fp8"),
    "policy.generation.vllm_cfg.kv_cache_dtype": ("auto", "fp8", "fp8_e4m3"),
    "policy.megatron_cfg.fp8_cfg.fp8": ("e4m3", "hybrid"),
    "policy.megatron_cfg.fp8_cfg.fp8_recipe": ("blockwise", "tensorwise", "mxfp8", "delayed"),
    "policy.megatron_cfg.moe_router_dtype": ("fp32", "fp64", None),
    "loss_fn.reference_policy_kl_type": ("k1", "k2", "k3"),
    "loss_fn.truncated_importance_sampling_type": (None, "tis", "icepop", "seq-mask-tis"),
}

# Keys whose base value is null but which hold a name (a string) when set.
NULLABLE.update({"policy.model_name": (str,)})


def check_keys(config: dict, base: dict, prov: dict[str, str]) -> list[Problem]:
    """Every key known (base config or project schema), with the base value's type."""
    issues: list[Problem] = []
    _check_node(config, base, "", prov, issues)
    return issues


def _check_node(
    node: dict, base: dict, prefix: str, prov: dict[str, str], issues: list[Problem]
) -> None:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in OPEN or path in PROJECT_SECTIONS or path in DERIVED or path == "defaults":
            continue
        if key not in base and path in ABSENT_BY_DEFAULT:
            _check_absent_by_default(path, value, prov, issues)
            continue
        if key not in base and path in NEMO_RL_KEYS:
            _check_nemo_rl_key(path, value, prov, issues)
            continue
        if key not in base:
            issues.append(_unknown_key(path, key, base, prefix, prov, len(issues) < DETAILED))
            continue
        expected = base[key]
        if value is None and path in NULLABLE_IN_NEMO_RL:
            continue
        if path in WIDER_TYPES and not isinstance(value, dict):
            _check_wider(path, value, prov, issues)
            continue
        if expected is None:
            _check_nullable(path, value, prov, issues)
            continue
        if isinstance(expected, dict) and isinstance(value, dict):
            _check_node(value, expected, f"{path}.", prov, issues)
        elif not _same_type(value, expected):
            issues.append(
                Problem(
                    path,
                    f"expected {_type_name(expected)}, got {_type_name(value)} ({value!r})",
                    f"set a {_type_name(expected)} value like the base config's {expected!r}",
                    source_of(prov, path),
                )
            )
        elif isinstance(value, float) and not math.isfinite(value):
            issues.append(_not_finite(path, value, expected, prov))


def _not_finite(path: str, value: float, example: Any, prov: dict[str, str]) -> Problem:
    return Problem(
        path,
        f"expected a finite number, got {value!r}",
        f"set a finite number like {example!r}",
        source_of(prov, path),
    )


def _check_nemo_rl_key(path: str, value: Any, prov: dict[str, str], issues: list[Problem]) -> None:
    """A key NeMo RL defines and the base leaves out (`nemo_rl_keys`): NeMo RL's type."""
    if nemo_rl_type_ok(path, value):
        return
    kind = NEMO_RL_KEYS[path].__name__
    issues.append(
        Problem(
            path,
            f"expected {kind} (NeMo RL's type for it), got {_type_name(value)} ({value!r})",
            f"set a {kind} value, or remove the key to keep NeMo RL's default",
            source_of(prov, path),
        )
    )


def _check_wider(path: str, value: Any, prov: dict[str, str], issues: list[Problem]) -> None:
    """A base key NeMo RL types more widely (`nemo_rl_keys.WIDER_TYPES`)."""
    kinds = WIDER_TYPES[path]
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = " or ".join(_type_name(k()) for k in kinds)
        issues.append(
            Problem(
                path,
                f"expected {names}, got {_type_name(value)} ({value!r})",
                f"set a {names} value",
                source_of(prov, path),
            )
        )


def _check_absent_by_default(
    path: str, value: Any, prov: dict[str, str], issues: list[Problem]
) -> None:
    """A key of `ABSENT_BY_DEFAULT`: the type NeMo RL reads it as."""
    kind = ABSENT_BY_DEFAULT[path]
    if not isinstance(value, kind):
        issues.append(
            Problem(
                path,
                f"expected {kind.__name__}, got {_type_name(value)} ({value!r})",
                f"set a {kind.__name__} value, or remove the key to keep NeMo RL's default",
                source_of(prov, path),
            )
        )


def _check_nullable(path: str, value: Any, prov: dict[str, str], issues: list[Problem]) -> None:
    """Keys whose base value is null: a number, or a name (or null) where NULLABLE says so."""
    kinds = NULLABLE.get(path)
    if kinds is None or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kinds):
        name = {(int,): "integer", (str,): "string"}.get(kinds, "number")
        issues.append(
            Problem(
                path,
                f"expected {name} or null, got {_type_name(value)} ({value!r})",
                f"set a {name}, or null to leave it unset",
                source_of(prov, path),
            )
        )
    elif isinstance(value, float) and not math.isfinite(value):
        issues.append(_not_finite(path, value, 1.0, prov))


# Problems found before an unknown key gets its "did you mean" (a search over every known key):
# a config of 100,000 misspelt keys is checked in seconds, and only the first are listed anyway.
DETAILED = 200


def _unknown_key(
    path: str, key: str, base: dict, prefix: str, prov: dict[str, str], detailed: bool = True
) -> Problem:
    """The problem of one key neither the base config nor the schema knows, with the nearest
    known name (only while `detailed`: past `DETAILED` problems, a plain fix)."""
    if not detailed:
        return Problem(
            path,
            "unknown key (not in the base config or the project schema)",
            "remove it",
            source_of(prov, path),
        )
    known = [str(k) for k in base]
    known += [k[len(prefix) :] for k in NEMO_RL_KEYS if k.startswith(prefix)]
    known = [k for k in dict.fromkeys(known) if "." not in k]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    fix = (
        f"did you mean {prefix}{close[0]}?"
        if close
        else f"remove it; known keys here: {', '.join(known)}"
    )
    source = source_of(prov, path)
    if source == "override":
        fix += f" ({OVERRIDE_KEYS})"
    return Problem(
        path,
        "unknown key (not in the base config or the project schema)",
        fix,
        source,
    )


# What an override may name, unlike NeMo RL's Hydra overrides (where `+` adds any key and a key
# nothing reads is ignored); `train --help` and docs/recipes.md say the same.
OVERRIDE_KEYS = (
    "an override, with + or without, sets only a key of the base config, of NeMo RL's config "
    "classes (config/nemo_rl_keys.py) or inside a free-form section (env, *.env_vars, "
    "vllm_kwargs, hf_config_overrides, slurm.env); NeMo RL's +key would add it and ignore it"
)


def _same_type(value: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(expected, bool)
    if isinstance(expected, float):
        return isinstance(value, (int, float))
    if isinstance(expected, int):
        return isinstance(value, int)
    if isinstance(expected, str):
        return value is None or isinstance(
            value, str
        )  # optional strings (paths, names) may be null
    if isinstance(expected, list):
        return isinstance(value, list)
    if isinstance(expected, dict):
        return isinstance(value, dict)
    return True


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
    }.get(type(value), type(value).__name__)


def check_values(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Ranges and choices of the NeMo RL keys that matter, and the project sections' models."""
    from nemo_fp8_rl.config.interpolate import is_missing, lookup

    issues: list[Problem] = []
    for key, (ok, text) in RANGES.items():
        value = lookup(config, key)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and not ok(value)
        ):
            issues.append(
                Problem(
                    key,
                    f"value {value!r} out of range",
                    f"use a value {text}",
                    source_of(prov, key),
                )
            )
    for key, choices in CHOICES.items():
        value = lookup(config, key)
        if not is_missing(value) and value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            issues.append(
                Problem(
                    key,
                    f"value {value!r} is not one of {shown}",
                    f"use one of {shown}",
                    source_of(prov, key),
                )
            )
    for key, model in PROJECT_SECTIONS.items():
        section = lookup(config, key)
        issues += validate_section(
            key, {} if is_missing(section) or section is None else section, model, prov
        )
    return issues


def validate_section(
    key: str, section: Any, model: type[BaseModel], prov: dict[str, str]
) -> list[Problem]:
    """Validate one project-owned section with its pydantic model; errors carry full key paths."""
    try:
        model.model_validate(section)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            path = f"{key}.{loc}" if loc else key
            if err["type"] == "extra_forbidden":
                known = ", ".join(model.model_fields)
                close = difflib.get_close_matches(
                    str(err["loc"][-1]), list(model.model_fields), n=1, cutoff=0.6
                )
                fix = f"did you mean {key}.{close[0]}?" if close else f"known keys: {known}"
                out.append(
                    Problem(
                        path, "unknown key (not in the project schema)", fix, source_of(prov, path)
                    )
                )
            else:
                out.append(
                    Problem(
                        path,
                        err["msg"],
                        f"see the {model.__name__} documentation",
                        source_of(prov, path),
                    )
                )
        return out
    return []


def source_of(prov: dict[str, str], key: str) -> str:
    """The file that set `key` (or the closest parent/child key that has a recorded source)."""
    if key in prov:
        return prov[key]
    for known, src in prov.items():
        if known.startswith(key + "."):
            return src
    parts = key.split(".")
    while parts:
        parts.pop()
        if ".".join(parts) in prov:
            return prov[".".join(parts)]
    return "?"
