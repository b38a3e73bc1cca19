"""`ModuleReceiver`: apply a verified refit to a transformers model (the embedded engine).

The model's parameters are addressed by HF checkpoint names; transformers ≥ 5 fused MoE experts
(`mlp.experts.gate_up_proj` `[E, 2I, H]`, `mlp.experts.down_proj` `[E, H, I]`) are addressed per
expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`) as views into those tensors. FP8 weights
are dequantized (q × scale) into the parameter's dtype. All checks run first; the model is
touched only when every tensor passed, so a rejected refit leaves it exactly as it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.stream import Bucket
from nemo_fp8_rl.refit.verify import Received, collect

_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def engine_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Map each HF checkpoint name of `model` to the tensor (or view) it loads into."""
    targets: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        match = _FUSED.match(name)
        if match is None or param.dim() != 3:
            targets[name] = param
            continue
        base, kind = match.groups()
        for e in range(param.shape[0]):
            if kind == "down_proj":
                targets[f"{base}.{e}.down_proj.weight"] = param[e]
            else:
                half = param.shape[1] // 2
                targets[f"{base}.{e}.gate_proj.weight"] = param[e, :half]
                targets[f"{base}.{e}.up_proj.weight"] = param[e, half:]
    return targets


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Checkpoint names that are the same tensor as another parameter (tied lm_head)."""
    out = set()
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    if callable(get_out) and callable(get_in):
        head, emb = get_out(), get_in()
        if head is not None and emb is not None and head.weight is emb.weight:
            out.add("lm_head.weight")
    return out


class ModuleReceiver:
    """Receives refit buckets into a transformers model (HF names, FP8 emulation modules ok)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.targets = engine_targets(model)
        self.aliases = _tied_aliases(model) - set(self.targets)

    def expected_names(self) -> set[str]:
        """HF weight names a complete refit must contain (scales are extra)."""
        return set(self.targets)

    def stage(self, received: Received) -> dict[str, torch.Tensor]:
        """Check names and shapes against the model; return the values to copy, by name."""
        problems: list[str] = []
        bad: list[str] = []
        names = set(received.tensors)
        for name in sorted(self.expected_names() - names):
            problems.append(f"{name}: missing from the refit")
            bad.append(name)
        for name in sorted(names - self.expected_names() - self.aliases):
            problems.append(f"{name}: the model has no such parameter")
            bad.append(name)
        staged: dict[str, torch.Tensor] = {}
        for name in sorted(names & self.expected_names()):
            target = self.targets[name]
            got = tuple(received.tensors[name].shape)
            if got != tuple(target.shape):
                problems.append(f"{name}: shape {list(got)}, the model needs {list(target.shape)}")
                bad.append(name)
            else:
                staged[name] = received.value(name, dtype=target.dtype)
        if problems:
            raise RefitError(problems, bad)
        return staged

    def apply(self, buckets: Iterable[Bucket], *, checksums: bool = True) -> int:
        """Verify all `buckets`, then write them into the model; return the number of tensors.

        Raises `RefitError` naming every bad tensor (NaN/Inf, shape, dtype, checksum, missing or
        unexpected name) and leaves the model unchanged. `checksums=False` (`plan.verify`
        false) skips the CRC-32 comparison only.
        """
        staged = self.stage(collect(buckets, checksums=checksums))
        with torch.no_grad():
            for name, value in staged.items():
                self.targets[name].copy_(value)
        return len(staged)
