"""Data-parallel calibration: every rank derives the same bounds as one process over all tokens.

Runs two real `torch.distributed` processes on the gloo (CPU) backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_fp8_rl.calibration import Calibrator, all_gather_rows
from nemo_fp8_rl.config.project import CalibrationConfig

WORLD = 2


def shard(rank: int) -> dict[str, torch.Tensor]:
    """Rank-specific tokens; ranks hold different counts (all_gather_rows must handle that)."""
    g = torch.Generator().manual_seed(rank)
    n = 3000 + 517 * rank
    r16 = torch.exp(0.1 * torch.randn(n, generator=g))
    r8 = r16 * (1 + 0.05 * torch.randn(n, generator=g))
    adv = torch.randn(n, generator=g)
    return {
        "fp8_ratio": r8,
        "bf16_ratio": r16,
        "advantages": adv,
        "weights": torch.rand(n, generator=g),
    }


def make_cal() -> Calibrator:
    return Calibrator(CalibrationConfig(enabled=True, min_tokens=100, smoothing=1.0), 0.2, 0.2)


def worker(rank: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    cal = make_cal()
    data = shard(rank)
    half = data["fp8_ratio"].numel() // 2
    for part in (slice(0, half), slice(half, None)):  # two micro-batches
        cal.observe(**{k: v[part] for k, v in data.items()})
    metrics = cal.update(0, gather=all_gather_rows)
    if rank == 0:  # next calibration step: rank 1 has no tokens at all
        cal.observe(**shard(5))
    again = cal.update(20, gather=all_gather_rows)
    out[rank] = (cal.bounds, metrics["calib_alpha"], metrics["calib_n_neg"], again["calib_n_neg"])
    dist.destroy_process_group()


def test_ranks_agree_with_single_process_over_all_tokens(tmp_path) -> None:
    out = mp.Manager().dict()
    mp.start_processes(
        worker, args=(str(tmp_path / "init"), out), nprocs=WORLD, start_method="fork"
    )
    single = make_cal()
    for rank in range(WORLD):
        single.observe(**shard(rank))
    metrics = single.update(0)
    assert single.bounds != (0.8, 1.2)
    single.observe(**shard(5))
    again = single.update(20)
    assert out[0] == out[1]
    assert out[0] == (
        single.bounds,
        metrics["calib_alpha"],
        metrics["calib_n_neg"],
        again["calib_n_neg"],
    )
