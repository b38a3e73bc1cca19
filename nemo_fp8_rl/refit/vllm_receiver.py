"""`VllmReceiver`: apply a verified refit to a vLLM engine through its worker `reload_weights`.

vLLM's `reload_weights(weights_iterator=...)` (worker method, vLLM ≥ 0.2x) restores each layer's
checkpoint-format parameters, runs `model.load_weights` (which stacks q/k/v and gate/up) and
re-runs `process_weights_after_loading`, so it accepts exactly the tensors of the checkpoint the
engine was started from: BF16 weights, block FP8 `weight` + `weight_scale_inv`, or
compressed-tensors per-channel `weight` + `weight_scale`. Raw `model.load_weights` would fail
on quantized layers, whose parameters are already in kernel layout.

The receiver checks the refit against that checkpoint's tensor names and shapes (read from
the safetensors headers) before calling the engine; a rejected refit never reaches it.
Tensors go through `collective_rpc`, which carries them only in the in-process engine
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `distributed_executor_backend="uni"`); a multiprocess
engine needs them moved by path instead (`write_refit_dir` + `reload_weights(weights_path=...)`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.safe_files import refuse_link
from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.export import checkpoint_shapes
from nemo_fp8_rl.refit.plan import misaligned_block_shards
from nemo_fp8_rl.refit.stream import Bucket
from nemo_fp8_rl.refit.verify import Received, collect


def check_against_checkpoint(
    received: Received, shapes: dict[str, tuple[int, ...]], optional: Iterable[str] = ()
) -> list[tuple[str, torch.Tensor]]:
    """Engine tensors of `received`, after checking names and shapes against `shapes`.

    Raises `RefitError` listing missing, unexpected and mis-shaped tensors.
    """
    items = received.engine_items()
    got = {name: tuple(t.shape) for name, t in items}
    problems: list[str] = []
    bad: list[str] = []
    if received.scheme == "block":
        fp8 = {n: tuple(t.shape) for n, t in received.tensors.items() if n in received.scales}
        for name in misaligned_block_shards(fp8):
            problems.append(
                f"{name}: {fp8[name][0]} rows is not a multiple of 128, so vLLM cannot place its "
                "block scales inside the fused module; build the plan with shapes "
                "(RefitPlan.from_config(config, {name: shape})) so such modules stay BF16"
            )
            bad.append(name)
    optional = set(optional)
    for name in sorted(set(shapes) - set(got) - optional):
        problems.append(f"{name}: missing from the refit")
        bad.append(name)
    for name in sorted(set(got) - set(shapes)):
        problems.append(f"{name}: the engine's checkpoint has no such tensor")
        bad.append(name)
    for name in sorted(set(got) & set(shapes)):
        want = shapes[name]
        if got[name] != want and not (len(want) <= 1 and got[name] in ((), (1,))):
            problems.append(f"{name}: shape {list(got[name])}, the engine loads {list(want)}")
            bad.append(name)
    if problems:
        raise RefitError(problems, bad)
    return items


class VllmReceiver:
    """Receives refit buckets into a vLLM `LLM` (or any object with `collective_rpc`).

    `refit_dir=None`: tensors go to `reload_weights(weights_iterator=...)` (in-process engine).
    With a `refit_dir`, the verified refit is written there as safetensors and the workers
    reload it by path, which also works when they run in other processes (vLLM then treats
    that directory as the model's weights path).
    """

    def __init__(
        self, llm: Any, checkpoint_dir: str | Path, refit_dir: str | Path | None = None
    ) -> None:
        self.llm = llm
        self.shapes = checkpoint_shapes(checkpoint_dir, bf16_source=False)
        if not self.shapes:
            raise FileNotFoundError(
                f"{checkpoint_dir}: no safetensors tensors; pass the engine's model dir"
            )
        self.refit_dir = None if refit_dir is None else Path(refit_dir)

    def apply(self, buckets: Iterable[Bucket], *, checksums: bool = True) -> int:
        """Verify all `buckets`, then reload them into the engine; return the tensor count.

        Raises `RefitError` (engine untouched) on any NaN/Inf, shape, dtype, checksum, missing
        or unexpected tensor. `checksums=False` (`plan.verify` false) skips the CRC-32 only.
        """
        items = check_against_checkpoint(collect(buckets, checksums=checksums), self.shapes)
        if self.refit_dir is None:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        else:
            path = write_refit_dir(items, self.refit_dir)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        return len(items)


def write_refit_dir(items: list[tuple[str, torch.Tensor]], out_dir: str | Path) -> Path:
    """Write verified engine tensors as `model.safetensors` in `out_dir` for
    `reload_weights(weights_path=)`: into a temporary sibling this process creates (O_EXCL,
    never a link), renamed over the file; nothing else in the folder is touched."""
    import tempfile

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / "model.safetensors"
    refuse_link(target)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".model.safetensors.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(dict(items), tmp, metadata={"format": "pt"})  # safe-write: private
        os.replace(tmp, target)  # safe-write: rename
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out
