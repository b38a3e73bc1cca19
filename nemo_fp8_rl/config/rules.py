"""Cross-field rules, checked at load time (NeMo RL checks most of them only after Ray is up).

Each rule takes the resolved config and returns the issues it finds; `RULES` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_fp8_rl.config import optimiser_steps
from nemo_fp8_rl.config.engine_rules import engine_rules
from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.lowprec_rules import four_bit_emulation
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.config.refit_rules import quantize_on_trainer
from nemo_fp8_rl.config.schema import source_of
from nemo_fp8_rl.config.split_rules import precision_split

Rule = Callable[[dict, dict[str, str]], list[Problem]]

VLLM = "policy.generation.vllm_cfg"
MCORE = "policy.megatron_cfg"


def _get(config: dict, key: str, default: Any = None) -> Any:
    value = lookup(config, key)
    return default if is_missing(value) else value


def _issue(prov: dict[str, str], key: str, problem: str, fix: str) -> Problem:
    return Problem(key, problem, fix, source_of(prov, key))


def fp8_rollout_needs_is(config: dict, prov: dict[str, str]) -> list[Problem]:
    """FP8 rollouts need importance-sampling correction (NeMo RL asserts it in `grpo.setup`)."""
    if _get(config, f"{VLLM}.precision") == "fp8" and not _get(
        config, "loss_fn.use_importance_sampling_correction"
    ):
        return [
            _issue(
                prov,
                "loss_fn.use_importance_sampling_correction",
                "FP8 rollout (vllm_cfg.precision: fp8) without importance-sampling correction",
                "set loss_fn.use_importance_sampling_correction: true",
            )
        ]
    return []


def fp8_kv_cache_requirements(config: dict, prov: dict[str, str]) -> list[Problem]:
    """FP8 KV cache needs FP8 precision, Megatron training, no async engine and PP = 1."""
    kv = _get(config, f"{VLLM}.kv_cache_dtype", "auto")
    if kv not in ("fp8", "fp8_e4m3"):
        return []
    key = f"{VLLM}.kv_cache_dtype"
    out = []
    if _get(config, f"{VLLM}.precision") != "fp8":
        out.append(
            _issue(
                prov,
                key,
                f"kv_cache_dtype {kv} needs FP8 rollout",
                f"set {VLLM}.precision: fp8 or kv_cache_dtype: auto",
            )
        )
    if not _get(config, f"{MCORE}.enabled") or _get(config, "policy.dtensor_cfg.enabled"):
        out.append(
            _issue(
                prov,
                key,
                "FP8 KV cache needs the Megatron training backend",
                f"set {MCORE}.enabled: true and policy.dtensor_cfg.enabled: false",
            )
        )
    if _get(config, f"{VLLM}.async_engine"):
        out.append(
            _issue(
                prov,
                f"{VLLM}.async_engine",
                "FP8 KV cache does not support the async vLLM engine",
                f"set {VLLM}.async_engine: false",
            )
        )
    if _get(config, f"{MCORE}.pipeline_model_parallel_size", 1) != 1:
        out.append(
            _issue(
                prov,
                f"{MCORE}.pipeline_model_parallel_size",
                "FP8 KV cache needs pipeline parallel size 1",
                "set pipeline_model_parallel_size: 1 (use tensor parallelism instead)",
            )
        )
    return out


def fp8_training_needs_megatron(config: dict, prov: dict[str, str]) -> list[Problem]:
    """FP8 training exists only on NeMo RL's Megatron path."""
    if _get(config, f"{MCORE}.fp8_cfg.enabled") and not _get(config, f"{MCORE}.enabled"):
        return [
            _issue(
                prov,
                f"{MCORE}.fp8_cfg.enabled",
                "FP8 training needs the Megatron backend",
                f"set {MCORE}.enabled: true (DTensor has no FP8 training)",
            )
        ]
    return []


def megatron_checkpoint_format(config: dict, prov: dict[str, str]) -> list[Problem]:
    """NeMo RL's `Policy.save_checkpoint` raises at the first checkpoint when a
    `model_save_format` is set for any worker but DTensor v2 (Megatron included)."""
    fmt = _get(config, "checkpointing.model_save_format")
    dtensor_v2 = _get(config, "policy.dtensor_cfg.enabled") and _get(
        config, "policy.dtensor_cfg._v2"
    )
    if _get(config, "checkpointing.enabled") and fmt is not None and not dtensor_v2:
        return [
            _issue(
                prov,
                "checkpointing.model_save_format",
                f"{fmt!r} is set, and NeMo RL refuses it at the first checkpoint outside DTensor v2 "
                "(lm_policy.Policy.save_checkpoint: 'model_save_format must be None')",
                "set checkpointing.model_save_format: null",
            )
        ]
    return []


def updates_per_step(config: dict) -> float:
    """Optimiser steps per rollout batch: prompts x generations / global batch size."""
    samples = _get(config, "grpo.num_prompts_per_step", 0) * _get(
        config, "grpo.num_generations_per_prompt", 0
    )
    return samples / max(1, _get(config, "policy.train_global_batch_size", 1))


def batch_sizes_divide(config: dict, prov: dict[str, str]) -> list[Problem]:
    """The rollout batch splits into whole global batches, and those into whole micro-batches."""
    samples = _get(config, "grpo.num_prompts_per_step", 0) * _get(
        config, "grpo.num_generations_per_prompt", 0
    )
    gbs = _get(config, "policy.train_global_batch_size", 1)
    mbs = _get(config, "policy.train_micro_batch_size", 1)
    out = []
    if gbs > 0 and samples % gbs:
        out.append(
            _issue(
                prov,
                "policy.train_global_batch_size",
                f"{samples} samples per step (num_prompts_per_step x num_generations_per_prompt) do not split into batches of {gbs}",
                "choose a train_global_batch_size that divides it",
            )
        )
    if mbs > 0 and gbs % mbs:
        out.append(
            _issue(
                prov,
                "policy.train_micro_batch_size",
                f"train_global_batch_size {gbs} is not a multiple of train_micro_batch_size {mbs}",
                "choose a micro-batch size that divides the global batch size",
            )
        )
    return out


def calibration_requirements(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Calibration needs FP8 training with BF16 masters, token-level ratios, and clipping that can act."""
    if not _get(config, "loss_fn.calibration.enabled"):
        return []
    key = "loss_fn.calibration.enabled"
    out = []
    if not _get(config, f"{MCORE}.fp8_cfg.enabled") and not _get(config, "local.fp4"):
        out.append(
            _issue(
                prov,
                key,
                "calibration on without FP8 training: BF16 and FP8 ratios coincide, so it is inert",
                f"enable {MCORE}.fp8_cfg or turn calibration off",
            )
        )
    if _get(config, f"{MCORE}.fp8_cfg.fp8_param"):
        out.append(
            _issue(
                prov,
                f"{MCORE}.fp8_cfg.fp8_param",
                "calibration needs BF16 master weights for its shadow passes, but fp8_param keeps parameters in FP8",
                "set fp8_param: false",
            )
        )
    if updates_per_step(config) <= 1:
        out.append(
            _issue(
                prov,
                "policy.train_global_batch_size",
                f"calibration on with {updates_per_step(config):g} optimiser step per rollout batch: the ratio stays at 1, clipping is structurally inactive",
                optimiser_steps.fix_text(config),
            )
        )
    if _get(config, "loss_fn.sequence_level_importance_ratios") or not _get(
        config, "loss_fn.token_level_loss", True
    ):
        out.append(
            _issue(
                prov,
                "loss_fn.sequence_level_importance_ratios",
                "calibration works on token-level ratios only",
                "set token_level_loss: true and sequence_level_importance_ratios: false",
            )
        )
    return out


def importance_sampling_settings(config: dict, prov: dict[str, str]) -> list[Problem]:
    """TIS types need the correction on and a positive ratio; icepop/seq-mask-tis need a minimum."""
    tis = _get(config, "loss_fn.truncated_importance_sampling_type")
    out = []
    if tis is not None:
        if not _get(config, "loss_fn.use_importance_sampling_correction"):
            out.append(
                _issue(
                    prov,
                    "loss_fn.truncated_importance_sampling_type",
                    f"{tis} needs importance-sampling correction",
                    "set loss_fn.use_importance_sampling_correction: true",
                )
            )
        ratio = _get(config, "loss_fn.truncated_importance_sampling_ratio")
        if ratio is None or ratio <= 0:
            out.append(
                _issue(
                    prov,
                    "loss_fn.truncated_importance_sampling_ratio",
                    f"{tis} needs a positive truncation ratio, got {ratio!r}",
                    "set truncated_importance_sampling_ratio, e.g. 2.0",
                )
            )
        if (
            tis in ("icepop", "seq-mask-tis")
            and _get(config, "loss_fn.truncated_importance_sampling_ratio_min") is None
        ):
            out.append(
                _issue(
                    prov,
                    "loss_fn.truncated_importance_sampling_ratio_min",
                    f"{tis} needs a lower bound",
                    "set truncated_importance_sampling_ratio_min, e.g. 0.5",
                )
            )
    clip_c = _get(config, "loss_fn.ratio_clip_c")
    if clip_c is not None and clip_c <= 1:
        out.append(
            _issue(
                prov,
                "loss_fn.ratio_clip_c",
                f"dual-clip constant {clip_c} must be > 1",
                "use e.g. 3.0 or null",
            )
        )
    return out


def tensor_parallel_batches(config: dict, prov: dict[str, str]) -> list[Problem]:
    """With TP >= 4 NeMo RL needs equal training and log-prob micro-batch sizes."""
    if _get(config, f"{MCORE}.tensor_model_parallel_size", 1) >= 4 and not _get(
        config, "loss_fn.force_on_policy_ratio"
    ):
        train, logprob = (
            _get(config, "policy.train_micro_batch_size"),
            _get(config, "policy.logprob_batch_size"),
        )
        if train != logprob:
            return [
                _issue(
                    prov,
                    "policy.logprob_batch_size",
                    f"with tensor_model_parallel_size >= 4, logprob_batch_size ({logprob}) must equal train_micro_batch_size ({train})",
                    f"set policy.logprob_batch_size: {train}",
                )
            ]
    return []


# (key, value the CPU engine cannot honour, why, fix) for `cpu_supported_features`.
_CPU_REFUSED = (
    (
        "logger.swanlab_enabled",
        True,
        "the embedded engine logs to TensorBoard, W&B and MLflow but does not carry SwanLab "
        "(another client and cloud login for a backend NeMo RL's own logger already serves on "
        "GPU recipes)",
        "set logger.swanlab_enabled=false and use logger.wandb_enabled or "
        "logger.mlflow_enabled, or train on the NeMo RL engine",
    ),
    (
        f"{MCORE}.fp8_cfg.fp8_param",
        True,
        "FP8 primary weights are a Transformer Engine GPU feature (and leave no BF16 reference)",
        f"set {MCORE}.fp8_cfg.fp8_param=false",
    ),
)
_CPU_PARALLEL = (
    f"{MCORE}.tensor_model_parallel_size",
    f"{MCORE}.pipeline_model_parallel_size",
    f"{MCORE}.context_parallel_size",
    f"{MCORE}.expert_model_parallel_size",
    f"{VLLM}.tensor_parallel_size",
    f"{VLLM}.pipeline_parallel_size",
)


def cpu_supported_features(config: dict, prov: dict[str, str]) -> list[Problem]:
    """On `gpus_per_node: 0` (the embedded engine) GPU-only features are refused with what to change."""
    if not on_cpu(config):
        return []
    where = "cluster.gpus_per_node is 0: the embedded CPU engine"
    out = [
        _issue(prov, key, f"{why} ({where})", fix)
        for key, bad, why, fix in _CPU_REFUSED
        if _get(config, key) == bad
    ]
    out += [
        _issue(prov, key, f"model parallelism needs several GPUs ({where})", f"set {key}=1")
        for key in _CPU_PARALLEL
        if (_get(config, key) or 1) != 1
    ]
    if _get(config, "cluster.num_nodes", 1) != 1:
        out.append(
            _issue(
                prov,
                "cluster.num_nodes",
                f"the embedded engine places one trainer and one rollout engine ({where})",
                "set cluster.num_nodes=1 (a Slurm job may still span nodes: nemo_fp8_rl.submit --nodes N)",
            )
        )
    return out


def parallel_sizes_divide_cluster(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Model-parallel groups tile the GPUs: TP x PP x CP (Megatron) and TP x PP (vLLM) must divide
    num_nodes x gpus_per_node (colocated generation shares the training GPUs)."""
    gpus = _get(config, "cluster.gpus_per_node", 0)
    world = gpus * _get(config, "cluster.num_nodes", 1)
    if not gpus or not _get(config, "policy.generation.colocated.enabled", True):
        return []
    groups = []
    if _get(config, f"{MCORE}.enabled"):
        keys = (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
        )
        groups.append((f"{MCORE}.{keys[0]}", [f"{MCORE}.{k}" for k in keys], "Megatron"))
    if _get(config, "policy.generation.backend") == "vllm":
        keys = ("tensor_parallel_size", "pipeline_parallel_size")
        groups.append((f"{VLLM}.{keys[0]}", [f"{VLLM}.{k}" for k in keys], "vLLM"))
    out = []
    for key, keys, who in groups:
        sizes = [_get(config, k, 1) or 1 for k in keys]
        size = sizes[0] * sizes[1] * (sizes[2] if len(sizes) > 2 else 1)
        if world % size:
            shown = " x ".join(
                f"{k.rsplit('.', 1)[1]}={v}" for k, v in zip(keys, sizes, strict=True)
            )
            fits = [d for d in range(1, world + 1) if world % d == 0]
            out.append(
                _issue(
                    prov,
                    key,
                    f"{who} model-parallel group of {size} GPUs ({shown}) does not divide the "
                    f"cluster's {world} GPUs (num_nodes x gpus_per_node)",
                    f"choose sizes whose product is one of {fits}",
                )
            )
    return out


def model_named(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Every recipe names its model."""
    if not _get(config, "policy.model_name"):
        return [
            _issue(
                prov,
                "policy.model_name",
                "no model set",
                "set policy.model_name (e.g. Qwen/Qwen3-8B-Base, or tiny-qwen3 on CPU)",
            )
        ]
    return []


RULES: tuple[Rule, ...] = (
    model_named,
    fp8_rollout_needs_is,
    fp8_kv_cache_requirements,
    fp8_training_needs_megatron,
    megatron_checkpoint_format,
    batch_sizes_divide,
    calibration_requirements,
    importance_sampling_settings,
    tensor_parallel_batches,
    cpu_supported_features,
    parallel_sizes_divide_cluster,
    quantize_on_trainer,
    four_bit_emulation,
    precision_split,
    engine_rules,
)


def check_rules(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Run every cross-field rule. Rules read typed values; the caller runs them only when the
    type checks passed, and a rule that still meets a value it cannot compare is reported as an
    issue naming what it checks, never as a traceback."""
    out: list[Problem] = []
    for rule in RULES:
        try:
            out += rule(config, prov)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            what = (rule.__doc__ or rule.__name__).split("\n")[0].rstrip(".")
            out.append(
                Problem(
                    "<rules>",
                    f"cannot check '{what}': a value it reads has the wrong type ({exc})",
                    "fix the types of the keys it names (see the other problems)",
                    "config",
                )
            )
    return out
