"""The non-colocated refit's process group on CPU: gloo over NeMo RL's TCPStore rendezvous.

NeMo RL's `init_collective` (both ends: `AbstractPolicyWorker.init_collective` and
`VllmInternalWorkerExtension.init_collective`) builds a `StatelessProcessGroup` (a
`torch.distributed.TCPStore` at the train cluster's master address and port) and then an NCCL
communicator on it; `stateless_process_group.py` imports `nccl.core` at module level, which is
absent here (`ModuleNotFoundError: No module named 'nccl'`) and needs a GPU. `GlooRefitGroup` is
the stand-in: the same rendezvous (a `TCPStore`, rank 0 its master, NeMo RL's rank layout:
training ranks first, then the generation ranks) and the one method NeMo RL's
`packed_broadcast_producer` / `packed_broadcast_consumer` call on the group,
`broadcast(tensor, src)`, done by a gloo process group. The packing, the buffers and the
receiving `_load_weights` stay NeMo RL's (run under `cpu_packing()`).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from nemo_fp8_rl.config.user_error import UserError

TIMEOUT = datetime.timedelta(minutes=10)  # a hung peer, not a loaded machine
PREFIX = "nemo_fp8_rl_refit"
CPU_REFIT_BUFFER_BYTES = 64 * 1024**2  # NeMo RL sizes it from the GPU's memory (`cpu_packing`)


class GlooRefitGroup:
    """A `StatelessProcessGroup` stand-in whose `broadcast` runs on gloo (see module doc)."""

    def __init__(self, master_address: str, port: int, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.tcp_store = dist.TCPStore(
            host_name=master_address,
            port=port,
            world_size=world_size,
            is_master=rank == 0,
            timeout=TIMEOUT,
        )
        self.group = dist.ProcessGroupGloo(
            dist.PrefixStore(PREFIX, self.tcp_store), rank, world_size, TIMEOUT
        )
        probe = torch.ones(1) if rank == 0 else torch.zeros(1)
        self.broadcast(probe, 0)  # NeMo RL's warm-up: rank 0 broadcasts a one
        if probe.item() != 1.0:
            raise UserError(
                f"refit group at {master_address}:{port}",
                f"rank {rank} of {world_size} "
                f"received {probe.item()} in the warm-up broadcast, not rank 0's 1.0",
                "every "
                "training and generation rank must join with the same address, port and world "
                "size (NeMo RL's init_collective on both sides)",
            )

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        """In-place broadcast of `tensor` from rank `src` (NeMo RL's group interface)."""
        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()


def rollout_rank(rank_prefix: int, train_world_size: int) -> int:
    """A generation worker's rank in the refit group, as NeMo RL's extension places it: after
    every training rank, at its engine's prefix plus its rank inside the engine
    (`resolve_rollout_rank`: `torch.distributed.get_rank()` of vLLM's worker), which is 0 for
    the CPU worker's one-process engine."""
    return train_world_size + rank_prefix


@contextlib.contextmanager
def cpu_packing() -> Iterator[None]:
    """NeMo RL's packed-broadcast buffer size on CPU, for the duration, on both ends.

    Producer and consumer each call `packed_tensor.get_target_packed_tensor_size()`, which
    sizes the buffer from the GPU's memory (`torch.cuda.get_device_properties`; the ends agree
    because they run on equal GPUs); here both read `CPU_REFIT_BUFFER_BYTES` instead. The CUDA
    side streams and device arguments are the `cuda_shim.cpu_streams()` entries."""
    from nemo_rl.utils import packed_tensor

    from nemo_fp8_rl.engines.nemo.cpu import cuda_shim

    saved = packed_tensor.get_target_packed_tensor_size
    packed_tensor.get_target_packed_tensor_size = lambda: CPU_REFIT_BUFFER_BYTES
    try:
        with cuda_shim.cpu_streams():
            yield
    finally:
        packed_tensor.get_target_packed_tensor_size = saved
