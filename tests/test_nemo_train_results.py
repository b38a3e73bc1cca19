"""Merging the `policy.train` results of a split calibration step (`merge_train_results`).

The contract tests build the results with NeMo RL's real `Policy.train` aggregation (and its
real FLOP tracker), once for a two-global-batch call and once per global batch; only the Ray
worker group is replaced, by `RecorderWorkerGroup`, which returns per-worker results shaped and
scaled as `MegatronPolicyWorker.train` produces them (1/M loss scale for the MoE and MTP
trackers, per-micro-batch metrics divided by the number of global batches, FLOPs per global
batch). The merged parts must read as the single call.
"""

from __future__ import annotations

import pytest
import torch
from test_nemo_contract import _skip_reason

from nemo_fp8_rl.engines.nemo.driver.train_results import merge_train_results, micro_batches

GBS, MBS, DP = 8, 2, 2


def _part(moe: float, mbs: int, flops: float, seconds: float) -> dict:
    return {
        "loss": torch.tensor([1.0]),
        "grad_norm": torch.tensor([moe]),
        "moe_metrics": {"load_balancing_loss": moe},
        "mtp_metrics": {"mtp_1_loss": 2 * moe, "grad_norm": moe},
        "total_flops": flops,
        "train_elapsed_seconds": seconds,
        "num_ranks": 4,
        "all_mb_metrics": {"loss": [1.0] * mbs, "lr": [1e-4] * mbs},
    }


def test_means_are_weighted_by_micro_batches_and_counts_add() -> None:
    parts = [_part(1.0, mbs=1, flops=10.0, seconds=1.0), _part(4.0, mbs=3, flops=30.0, seconds=2.0)]
    merged = merge_train_results(parts)
    assert [micro_batches(p) for p in parts] == [1, 3]
    assert merged["moe_metrics"] == {"load_balancing_loss": (1.0 + 3 * 4.0) / 4}
    assert merged["mtp_metrics"] == {"mtp_1_loss": (2.0 + 3 * 8.0) / 4, "grad_norm": 4.0}
    assert merged["total_flops"] == 40.0 and merged["train_elapsed_seconds"] == 3.0
    assert merged["num_ranks"] == 4 and merged["grad_norm"].tolist() == [4.0]


def test_metrics_only_some_parts_carry_are_merged_over_those() -> None:
    first, second = _part(1.0, 2, 1.0, 1.0), _part(3.0, 2, 1.0, 1.0)
    del second["moe_metrics"], second["total_flops"]
    merged = merge_train_results([first, second])
    assert merged["moe_metrics"] == {"load_balancing_loss": 1.0}
    assert merged["total_flops"] == 1.0


# ---- against NeMo RL's Policy.train ---------------------------------------------------------


class RecorderWorkerGroup:
    """Recorder for NeMo RL's Ray worker group: per-DP-rank results as the Megatron worker makes.

    Each sample carries a synthetic MoE aux loss (`aux`) and MTP hit count (`mtp_hits`, of 10
    predicted tokens). Per call with B global batches of M micro-batches (all ranks): the MoE and
    MTP loss metrics are Σ_mb mean(aux) / M (the worker's 1/M loss scale, reduced over ranks),
    the acceptance rate Σ hits / Σ predicted · 100, the loss of global batch b is Σ aux over it
    and the gradient norms (of the last optimiser step) are the last global batch's loss,
    per-micro-batch `loss` entries are divided by B, `total_flops` = 1e9 · gbs · B,
    `train_elapsed_seconds` = 0.5 · B.
    """

    def __init__(self, world_size: int) -> None:
        self.cluster = type("Cluster", (), {"world_size": lambda _self: world_size})()
        self.calls: list[dict] = []

    def run_all_workers_sharded_data(self, method, data, common_kwargs, **_axes):
        self.calls.append({"method": method, "shards": len(data), **common_kwargs})
        return data, common_kwargs

    def shutdown(self, **_kwargs) -> bool:  # Policy.__del__ shuts its worker group down
        return True

    def get_all_worker_results(self, futures):
        shards, kw = futures
        gbs, mbs = kw["gbs"], kw["mbs"]
        per_rank_gb = gbs // len(shards)
        batches = shards[0]["aux"].shape[0] // per_rank_gb
        mb_aux = [
            float(s["aux"][i : i + mbs].mean())
            for s in shards
            for i in range(0, len(s["aux"]), mbs)
        ]
        hits = sum(float(s["mtp_hits"].sum()) for s in shards)
        total = 10.0 * sum(s["mtp_hits"].shape[0] for s in shards)
        moe = sum(mb_aux) / len(mb_aux)
        gb_loss = [
            sum(float(s["aux"][b * per_rank_gb : (b + 1) * per_rank_gb].sum()) for s in shards)
            for b in range(batches)
        ]
        return [
            {
                "global_loss": torch.tensor(gb_loss),
                "grad_norm": torch.tensor([gb_loss[-1]]),
                "gpu_name": "recorder",
                "model_dtype": torch.bfloat16,
                "moe_metrics": {"load_balancing_loss": moe, "moe/load_balancing_loss_layer_0": moe},
                "mtp_metrics": {
                    "mtp_1_loss": 2 * moe,
                    "mtp_1_acceptance_rate": 100.0 * hits / total,
                    "grad_norm": gb_loss[-1],
                },
                "total_flops": 1e9 * gbs * batches,
                "num_ranks": DP,
                "train_elapsed_seconds": 0.5 * batches,
                "all_mb_metrics": {
                    "loss": [
                        float(s["aux"][i : i + mbs].sum()) / batches
                        for i in range(0, len(s["aux"]), mbs)
                    ],
                    "lr": [1e-4] * (len(s["aux"]) // mbs),
                },
            }
            for s in shards
        ]


def _policy(flops_tracker) -> object:
    """NeMo RL's `Policy` without its constructor (which starts Ray workers), recorder inside."""
    import numpy as np
    from nemo_rl.distributed.named_sharding import NamedSharding
    from nemo_rl.models.policy.lm_policy import Policy

    policy = Policy.__new__(Policy)
    policy.cfg = {"train_global_batch_size": GBS, "train_micro_batch_size": MBS}
    axes = ["data_parallel", "pipeline_parallel", "context_parallel", "tensor_parallel"]
    policy.sharding_annotations = NamedSharding(np.arange(DP).reshape(DP, 1, 1, 1), axes)
    policy.use_dynamic_batches = policy.use_sequence_packing = False
    policy.debug_payload_metrics = False
    policy.flops_tracker = flops_tracker
    policy.worker_group = RecorderWorkerGroup(DP)
    return policy


def _batch(rows: int):
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 17, (rows,), generator=gen)
    return BatchedDataDict(
        {
            "input_ids": torch.zeros(rows, 16, dtype=torch.long),
            "input_lengths": lengths,
            "aux": torch.rand(rows, generator=gen),
            "mtp_hits": torch.randint(0, 11, (rows,), generator=gen).float(),
        }
    )


def _flops_tracker():
    from nemo_rl.utils.flops_tracker import FLOPTracker
    from transformers import Qwen2Config

    config = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return FLOPTracker.from_config("tiny-qwen2", config)


@pytest.mark.nemo_rl
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
@pytest.mark.parametrize("tracker", ["driver FLOP tracker", "worker FLOPs"])
def test_split_step_reads_as_nemo_rl_single_call(tracker: str) -> None:
    from nemo_rl.models.policy.lm_policy import Policy

    make = _flops_tracker if tracker == "driver FLOP tracker" else (lambda: None)
    data, loss_fn = _batch(2 * GBS), object()
    single_policy, split_policy = _policy(make()), _policy(make())
    single = Policy.train(single_policy, data, loss_fn)
    parts = [Policy.train(split_policy, data.slice(lo, lo + GBS), loss_fn) for lo in (0, GBS)]
    merged = merge_train_results(parts)

    assert [c["gbs"] for c in split_policy.worker_group.calls] == [GBS, GBS]
    for key in ("moe_metrics", "mtp_metrics"):
        assert key in single and merged[key] == pytest.approx(single[key], rel=1e-6), key
    # NeMo RL's FLOP keys of this snapshot and tracker (the worker's total_flops and elapsed
    # time reach the result only where Policy.train aggregates them).
    flop_keys = {"total_flops", "train_elapsed_seconds", "num_ranks", "theoretical_tflops"}
    present = flop_keys & single.keys()
    if tracker == "driver FLOP tracker":
        assert "total_flops" in present
    assert present == flop_keys & merged.keys()
    for key in present:
        assert merged[key] == pytest.approx(single[key], rel=1e-9), key
    # grpo_train's reduction: sums of the per-micro-batch lists, the mean of lr.
    for key, values in single["all_mb_metrics"].items():
        assert sum(merged["all_mb_metrics"][key]) == pytest.approx(sum(values)), key
    assert merged["loss"].tolist() == pytest.approx(single["loss"].tolist())
