"""One `train()` call of the CPU policy worker: NeMo RL's Megatron train loop, on the CPU.

Per global batch (NeMo RL's Megatron worker, 7ea279a, `train`): take the batch, count its
valid sequences/tokens across data-parallel ranks, zero DDP's grad buffers and the optimizer,
run megatron-core's `forward_backward_func` over `mbs`-sized microbatches with NeMo RL's
loss wrapper (`steps.loss_function`), then (not in eval mode) clip and take one optimizer
step. Metrics per microbatch as NeMo RL keeps them (values divided by the number of global
batches except `*_min`/`*_max`, plus `lr`, `wd`, `global_valid_seqs`, `global_valid_toks`);
the LR scheduler ticks once per call (`increment=gbs`); the returned dict has NeMo RL's keys.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import nullcontext
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.engines.nemo.cpu import cuda_shim, optim, steps


def _gb_metrics(losses_reduced: list[dict], n_gb: int, lr: float, wd: float, counts) -> list:
    out = []
    for x in losses_reduced:
        m = {k: (v if "_min" in k or "_max" in k else v / n_gb) for k, v in x.items()}
        m.update(
            lr=lr, wd=wd, global_valid_seqs=counts[0].item(), global_valid_toks=counts[1].item()
        )
        out.append(m)
    return out


def _step(worker: Any, eval_mode: bool) -> float:
    """Clip and step (training), or nothing (eval); returns the grad norm."""
    if eval_mode:
        return 0.0
    norm = optim.clip_main_grads(worker.model, worker.clip_grad)
    with cuda_shim.cpu_devices():
        ok, _, _ = worker.optimizer.step()
    if not ok:
        raise RuntimeError("error: CPU policy worker: the optimizer step reported a failure")
    return norm


def train(worker: Any, data: Any, loss_fn: Any, eval_mode: bool, gbs: int, mbs: int) -> dict:
    """Train (or evaluate) on the worker's data shard; NeMo RL's result dict."""
    from megatron.core import parallel_state as ps

    dp_group = ps.get_data_parallel_group()
    local_gbs = gbs // worker.dp_size
    total = torch.tensor(data.size)
    torch.distributed.all_reduce(total, group=dp_group)
    n_gb = int(total.item()) // gbs
    if n_gb < 1:
        raise UsageError(
            "CPU policy worker train",
            f"{int(total.item())} samples < global batch {gbs}",
            "send at least policy.train_global_batch_size samples",
        )
    worker.model.eval() if eval_mode else worker.model.train()
    start = time.perf_counter()
    all_mb, losses, grad_norm = [], [], 0.0
    with torch.no_grad() if eval_mode else nullcontext():
        for gb_idx in range(n_gb):
            batch = data.get_batch(batch_idx=gb_idx, batch_size=local_gbs)
            counts = steps.valid_counts(batch, dp_group)
            mbatches = list(batch.make_microbatch_iterator(mbs))
            if not eval_mode:
                worker.model.zero_grad_buffer()
                worker.optimizer.zero_grad()

            def make_post(mb: Any, n: int = len(mbatches), c: Any = counts) -> Any:
                return steps.loss_function(loss_fn, mb, worker.cfg, worker.sampling_params, n, c)

            with cuda_shim.cpu_devices():
                reduced = steps.run(worker.model, mbatches, make_post, forward_only=eval_mode)
            grad_norm = _step(worker, eval_mode)
            lr = (
                worker.scheduler.get_lr(worker.optimizer.param_groups[0])
                if worker.scheduler
                else 0.0
            )
            wd = worker.scheduler.get_wd() if worker.scheduler else 0.0
            gb = _gb_metrics(reduced, n_gb, lr, wd, counts)
            all_mb.extend(gb)
            losses.append(float(torch.tensor([float(m["loss"]) for m in gb]).sum()))
    if not eval_mode:
        worker.scheduler.step(increment=gbs)
    global_loss = torch.tensor(losses)
    torch.distributed.all_reduce(global_loss, group=dp_group)
    mb_metrics: dict[str, list] = defaultdict(list)
    for m in all_mb:
        for k, v in m.items():
            mb_metrics[k].append(v)
    return {
        "global_loss": global_loss,
        "rank": torch.distributed.get_rank(),
        "gpu_name": "cpu",
        "model_dtype": worker.dtype,
        "all_mb_metrics": dict(mb_metrics),
        "grad_norm": torch.tensor([grad_norm]),
        "train_elapsed_seconds": time.perf_counter() - start,
    }
