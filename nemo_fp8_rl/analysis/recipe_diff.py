"""What differs between resolved recipes, grouped by why it may differ.

`diff_configs` flattens resolved configs to dotted keys and groups every key whose value differs:
`precision` (FP8 in vLLM and Megatron, and the keys FP8 recipes must change with it), `forced`
(a key an FP8 recipe must set for its engine to run, with the reason in `FORCED`), `refit`,
`calibration` (`loss_fn.calibration`), `derived` (paths and names that follow from the file name)
and `other`. A BF16/FP8 pair is a fair comparison only when nothing differs under `other`;
otherwise the diff carries a warning naming the keys. `precision_of` tells a run's precision from
its config. Plain data: `nemo_fp8_rl.analysis.compare` diffs the recipes of the runs it compares,
`nemo_fp8_rl.analysis.report` renders the diff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_fp8_rl.config.schema import DERIVED

# Keys an FP8 recipe changes together with the precision switch (nemo-rl reference, section 2).
PRECISION_PREFIXES = (
    "policy.megatron_cfg.fp8_cfg.",
    "policy.megatron_cfg.env_vars.NVTE_FP8",
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer",
    "policy.megatron_cfg.moe_router_dtype",
    "policy.generation.vllm_cfg.precision",
    "policy.generation.vllm_cfg.kv_cache_dtype",
    "policy.generation.vllm_cfg.use_deep_gemm",
    "policy.generation.vllm_cfg.is_mx",
    "policy.generation.vllm_cfg.num_first_layers_in_bf16",
    "policy.generation.vllm_cfg.num_last_layers_in_bf16",
    "policy.generation.vllm_cfg.pow2_",
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
    "loss_fn.use_importance_sampling_correction",
    "loss_fn.truncated_importance_sampling_",
)
# Keys a pair may differ in only because the FP8 engine needs it, with the reason (the recipe
# that sets the key says the same, with its evidence).
FORCED = {
    "policy.generation.vllm_kwargs.kv_cache_memory_bytes": (
        "FP8 rollout memory: vLLM 0.25.1 (NeMo RL main) runs out of memory waking the FP8 engine "
        "unless the KV cache is pinned (NeMo RL's grpo-llama3.1-8b-instruct-1n8g-megatron-"
        "fp8-rollouts.v3.yaml pins 20 GiB)"
    ),
    "policy.generation.vllm_cfg.env_vars.VLLM_USE_RAY_V2_EXECUTOR_BACKEND": (
        "FP8 patches reach vLLM's workers: vLLM 0.25.1 (NeMo RL main) defaults to RayExecutorV2, "
        "which NeMo RL's FP8 patches miss at vLLM TP x PP > 1 (NVIDIA-NeMo/RL#3755); '0' selects "
        "the v1 Ray executor they wrap"
    ),
}
REFIT_PREFIXES = ("refit.", "policy.refit_", "policy.generation.refit_")
CALIBRATION_PREFIXES = ("loss_fn.calibration.",)
DERIVED_KEYS = DERIVED  # derived from the recipe name: differ in every pair, by design
GROUPS = ("precision", "forced", "refit", "calibration", "other", "derived")
ABSENT = "<absent>"


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to `{"a.b.c": leaf}`; lists are leaves, empty dicts hold no keys."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def group_of(key: str) -> str:
    """The diff group of a dotted key: precision, forced, refit, calibration, derived or other."""
    if key in DERIVED_KEYS:
        return "derived"
    if key in FORCED:
        return "forced"
    for group, prefixes in (
        ("calibration", CALIBRATION_PREFIXES),
        ("precision", PRECISION_PREFIXES),
        ("refit", REFIT_PREFIXES),
    ):
        if key.startswith(prefixes):
            return group
    return "other"


@dataclass(frozen=True)
class DiffEntry:
    """One differing key: its value in each config (`ABSENT` where a config lacks it)."""

    key: str
    values: tuple[Any, ...]
    group: str


@dataclass
class RecipeDiff:
    """The keys whose values differ between two or more resolved configs."""

    names: list[str]
    entries: list[DiffEntry]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why each `forced` key differs

    def by_group(self) -> dict[str, list[DiffEntry]]:
        """Entries by group, in `GROUPS` order, empty groups left out."""
        grouped = {g: [e for e in self.entries if e.group == g] for g in GROUPS}
        return {g: entries for g, entries in grouped.items() if entries}

    @property
    def fair(self) -> bool:
        """True when the configs differ only in precision, forced, refit, calibration and derived keys."""
        return not any(e.group == "other" for e in self.entries)


def diff_configs(names: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> RecipeDiff:
    """Diff resolved configs key by key (n-way: a key differs unless all values are equal).

    Raises:
        ValueError: fewer than two configs, or names and configs of different lengths.
    """
    if len(configs) < 2 or len(names) != len(configs):
        raise ValueError(
            f"need two or more configs with one name each, got {len(configs)} configs and {len(names)} names"
        )
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat))
    entries = []
    for key in keys:
        values = tuple(f.get(key, ABSENT) for f in flat)
        if any(v != values[0] for v in values[1:]):
            entries.append(DiffEntry(key, values, group_of(key)))
    diff = RecipeDiff(list(names), entries)
    diff.notes += [f"forced: {e.key}: {FORCED[e.key]}" for e in entries if e.group == "forced"]
    other = [e.key for e in entries if e.group == "other"]
    if other:
        shown = ", ".join(other[:8]) + (f" and {len(other) - 8} more" if len(other) > 8 else "")
        diff.warnings.append(
            f"not a fair precision comparison: {len(other)} key(s) differ outside the "
            f"precision/refit/calibration groups: {shown}"
        )
    return diff


def precision_of(config: Mapping[str, Any] | None) -> str:
    """The run precision: `fp8` when vLLM rollout or Megatron training is FP8, else `bf16`; `?` unknown."""
    if not config:
        return "?"
    flat = flatten(config)
    rollout = flat.get("policy.generation.vllm_cfg.precision") == "fp8"
    training = flat.get("policy.megatron_cfg.fp8_cfg.enabled") is True
    return "fp8" if rollout or training else "bf16"
