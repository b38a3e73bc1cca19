"""megatron-core's optimizer and LR scheduler for the CPU worker, from NeMo RL's config keys.

`policy.megatron_cfg.optimizer` is megatron-core's `OptimizerConfig` (NeMo RL hands the same
dict to megatron-bridge's subclass), and `megatron_cfg.scheduler` megatron-bridge's
`SchedulerConfig`, whose iteration counts become sample counts (`iters * global batch`):
NeMo RL then ticks the scheduler once per `train()` call with `increment=gbs`. The optimizer
is megatron-core's `get_megatron_optimizer` over the DDP-wrapped model, built with FP32
parameters (`FP32Optimizer`: megatron-core's mixed-precision optimizer asserts CUDA tensor
types), and with `clip_grad=0`: megatron-core's clipping asserts CUDA tensors, so
`clip_main_grads` applies the configured `clip_grad` with megatron-core's rule
(`coef = clip / (norm + 1e-6)`, applied when below 1) to the DDP main grads first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def optimizer_config(meg: dict[str, Any]) -> tuple[Any, float]:
    """(megatron-core `OptimizerConfig` with `clip_grad=0`, the configured clip_grad)."""
    from megatron.core.optimizer import OptimizerConfig

    known = {f.name for f in dataclasses.fields(OptimizerConfig)}
    given = dict(meg.get("optimizer") or {})
    clip = float(given.get("clip_grad", 0.0) or 0.0)
    kwargs = {k: v for k, v in given.items() if k in known}
    kwargs.update(
        clip_grad=0.0,
        bf16=False,
        fp16=False,
        params_dtype=torch.float32,
        use_distributed_optimizer=False,
        use_precision_aware_optimizer=False,
        optimizer_cpu_offload=False,
    )
    return OptimizerConfig(**kwargs), clip


def build(model: Any, meg: dict[str, Any], gbs: int) -> tuple[Any, Any, float]:
    """(optimizer, scheduler, clip_grad) for the DDP-wrapped `model`."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    config, clip = optimizer_config(meg)
    optimizer = get_megatron_optimizer(config, [model], use_gloo_process_groups=False)
    sched = dict(meg.get("scheduler") or {})
    decay_iters = sched.get("lr_decay_iters") or meg.get("train_iters") or 1
    train_iters = meg.get("train_iters") or decay_iters
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=sched.get("lr_warmup_init", 0.0),
        max_lr=config.lr,
        min_lr=config.min_lr or 0.0,
        lr_warmup_steps=int(sched.get("lr_warmup_iters", 0)) * gbs,
        lr_decay_steps=int(decay_iters) * gbs,
        lr_decay_style=sched.get("lr_decay_style", "constant"),
        start_wd=sched.get("start_weight_decay", config.weight_decay),
        end_wd=sched.get("end_weight_decay", config.weight_decay),
        wd_incr_steps=int(train_iters) * gbs,
        wd_incr_style=sched.get("weight_decay_incr_style", "constant"),
        use_checkpoint_opt_param_scheduler=sched.get("use_checkpoint_opt_param_scheduler", True),
        override_opt_param_scheduler=sched.get("override_opt_param_scheduler", False),
    )
    return optimizer, scheduler, clip


@torch.no_grad()
def clip_main_grads(model: torch.nn.Module, clip: float, dp_group: Any = None) -> float:
    """L2 norm of the DDP main grads (identical on every DP rank after the all-reduce), clipped
    in place to `clip` when `clip > 0`; returns the norm before clipping."""
    grads = [p.main_grad for p in model.parameters() if p.requires_grad and hasattr(p, "main_grad")]
    if not grads:
        return 0.0
    norm = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))
    if clip > 0.0:
        coef = clip / (norm + 1.0e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm
