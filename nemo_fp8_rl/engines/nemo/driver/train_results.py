"""One NeMo RL `policy.train` result from the n calls of a split calibration step.

A calibration step in `in_loop` mode trains its n global batches in n `policy.train` calls; what
`grpo_train` receives must read as NeMo RL's single n-batch call would. The semantics follow NeMo
RL's own producers (`Policy.train`, `MegatronPolicyWorker.train`, `get_moe_metrics`,
`get_mtp_metrics`) and consumers (`grpo_train`'s metric reduction, `print_performance_metrics`):

- `loss`: one entry per global batch, so the parts' are concatenated.
- `grad_norm`, `draft_grad_norm`, `mtp_metrics["grad_norm"]`: the last optimiser step's.
- `all_mb_metrics`: per-micro-batch lists, concatenated; the worker divides summable entries by
  the number of global batches of its call (1 per part), so they are divided by n here;
  `lr`, `wd`, `global_valid_*` (averaged by `grpo_train`) and `*_min` / `*_max` are kept as is.
- `moe_metrics`, `mtp_metrics` (losses, acceptance rates): the worker reports each as a mean
  over the call's M micro-batches (loss scale 1/M), so the merged value is the micro-batch
  weighted mean  v = Σ_i M_i v_i / Σ_i M_i  (M_i = micro-batch entries of part i). For the
  acceptance rates (ratios of token counts) this is exact when the parts have equal token counts.
- `total_flops`, `train_elapsed_seconds`: additive, summed (so the FLOPS that NeMo RL prints,
  total_flops / train_elapsed_seconds, is the step's rate, not n times it).
- anything else (`num_ranks`, `theoretical_tflops`, ...): the last call's (same for every call).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_fp8_rl.engines.nemo.worker.observations import PAYLOAD_KEY

# NeMo RL averages these over micro-batches instead of summing, and the worker does not divide
# them by the number of global batches (megatron_policy_worker.train).
MEAN_KEYS = frozenset({"lr", "wd", "global_valid_seqs", "global_valid_toks"})
ADDITIVE_KEYS = ("total_flops", "train_elapsed_seconds")
MEAN_DICT_KEYS = ("moe_metrics", "mtp_metrics")
# Inside the mean dictionaries: values of the last optimiser step, not means.
_LAST_STEP_ENTRIES = frozenset({"grad_norm"})


def _is_extremum(key: str) -> bool:
    return "_min" in key or "_max" in key


def micro_batches(part: dict[str, Any]) -> int:
    """Micro-batch entries of one `policy.train` result (every micro-batch carries `lr`)."""
    metrics = part.get("all_mb_metrics") or {}
    for key in ("lr", "loss"):
        if metrics.get(key):
            return len(metrics[key])
    return 1


def _weighted_means(dicts: list[dict[str, Any]], weights: list[int]) -> dict[str, Any]:
    """Σ w_i d_i[k] / Σ w_i per key over the parts holding k; last-step entries from the last."""
    merged: dict[str, Any] = {}
    keys = dict.fromkeys(k for d in dicts for k in d)
    for key in keys:
        pairs = [(d[key], w) for d, w in zip(dicts, weights, strict=True) if key in d]
        if key in _LAST_STEP_ENTRIES:
            merged[key] = pairs[-1][0]
        else:
            merged[key] = sum(float(v) * w for v, w in pairs) / sum(w for _, w in pairs)
    return merged


def _merge_mb_metrics(parts: list[dict[str, Any]]) -> dict[str, list[Any]]:
    n = len(parts)
    metrics: dict[str, list[Any]] = {}
    for part in parts:
        for key, values in part["all_mb_metrics"].items():
            if key == PAYLOAD_KEY or key in MEAN_KEYS or _is_extremum(key):
                scaled = list(values)
            else:
                scaled = [v / n for v in values]
            metrics.setdefault(key, []).extend(scaled)
    return metrics


def merge_train_results(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One `policy.train` result from n single-global-batch calls (as one n-batch call reads)."""
    if len(parts) == 1:
        return parts[0]
    merged = dict(parts[-1])
    merged["loss"] = torch.cat([torch.as_tensor(p["loss"]).reshape(-1) for p in parts])
    for key in ADDITIVE_KEYS:
        if any(key in p for p in parts):
            merged[key] = sum(p[key] for p in parts if key in p)
    weights = [micro_batches(p) for p in parts]
    for key in MEAN_DICT_KEYS:
        holding = [(p[key], w) for p, w in zip(parts, weights, strict=True) if key in p]
        if holding:
            merged[key] = _weighted_means([d for d, _ in holding], [w for _, w in holding])
    merged["all_mb_metrics"] = _merge_mb_metrics(parts)
    return merged
