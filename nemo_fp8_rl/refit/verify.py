"""Receiver-side verification of a whole refit, before anything is applied.

`collect(buckets)` checks, for every bucket and tensor: bucket indices 0..n-1 with the last one
flagged; each manifest entry matched by a tensor of that shape, dtype and CRC-32; no duplicate
or unlisted tensors; every FP8 weight paired with a scale of the scheme's shape; all values
finite (FP8 bytes included). Every defect is collected, then one `RefitError` names them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from nemo_fp8_rl.fp8 import FP8Spec, dequantize, scale_inv_shape
from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.stream import Bucket, checksum, dtype_name, nonfinite_count

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_GRANULARITY = {"block": "blockwise", "tensor": "tensorwise", "channel": "per_channel"}
_SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")


@dataclass
class Received:
    """A verified refit: engine-named tensors, FP8 weights with their scales."""

    scheme: str
    scale: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    scales: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def spec(self) -> FP8Spec | None:
        """The FP8 spec the sender used (None for a BF16 refit)."""
        if self.scheme == "bf16":
            return None
        return FP8Spec("e4m3", _GRANULARITY[self.scheme], self.scale)

    def value(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight `name` as the engine will compute with it (FP8 dequantized: q × scale)."""
        tensor = self.tensors[name]
        if tensor.dtype in _FP8:
            assert self.spec is not None
            return dequantize(tensor, self.scales[name], self.spec, dtype=dtype)
        return tensor.to(dtype)

    def engine_items(self) -> list[tuple[str, torch.Tensor]]:
        """All tensors as the engine loads them: weights, then `<name>_scale_inv`/`weight_scale`."""
        items = list(self.tensors.items())
        for name, scale in self.scales.items():
            items.append((_scale_name(name, self.scheme), scale))
        return items


def _scale_name(weight: str, scheme: str) -> str:
    if scheme == "block":
        return weight + "_scale_inv"
    return weight.removesuffix("weight") + "weight_scale"


def _weight_of_scale(name: str) -> str | None:
    for suffix in _SCALE_SUFFIXES:
        if name.endswith("." + suffix):
            return name[: -len(suffix)] + "weight"
    return None


def _check_buckets(buckets: list[Bucket], problems: list[str]) -> None:
    if not buckets:
        problems.append("no buckets received")
        return
    indices = [b.index for b in buckets]
    if indices != list(range(len(buckets))):
        problems.append(f"bucket indices {indices} are not 0..{len(buckets) - 1} in order")
    if not buckets[-1].last or any(b.last for b in buckets[:-1]):
        problems.append(
            "the refit is incomplete: the final bucket (last=True) is missing or misplaced"
        )
    if len({(b.scheme, b.scale) for b in buckets}) > 1:
        problems.append("buckets disagree on the FP8 scheme")


def _check_entries(
    bucket: Bucket,
    seen: dict[str, torch.Tensor],
    problems: list[str],
    bad: list[str],
    checksums: bool,
) -> None:
    listed = {e.name for e in bucket.entries}
    for extra in sorted(set(bucket.tensors) - listed):
        problems.append(f"{extra}: tensor not in the bucket manifest")
        bad.append(extra)
    for entry in bucket.entries:
        tensor = bucket.tensors.get(entry.name)
        problem = None
        if tensor is None:
            problem = "listed in the manifest but missing from the bucket"
        elif entry.name in seen:
            problem = "sent more than once"
        elif tuple(tensor.shape) != entry.shape or dtype_name(tensor.dtype) != entry.dtype:
            problem = (
                f"is {dtype_name(tensor.dtype)}{list(tensor.shape)}, manifest says "
                f"{entry.dtype}{list(entry.shape)}"
            )
        elif checksums and checksum(tensor) != entry.checksum:
            problem = "checksum mismatch (corrupted in transit)"
        if problem:
            problems.append(f"{entry.name}: {problem}")
            bad.append(entry.name)
        else:
            seen[entry.name] = tensor


def _split_scales(
    received: Received, seen: dict[str, torch.Tensor], problems: list[str], bad: list[str]
) -> None:
    spec = received.spec
    for name, tensor in seen.items():
        if _weight_of_scale(name) is None:
            received.tensors[name] = tensor
    for name, tensor in seen.items():
        weight = _weight_of_scale(name)
        if weight is None:
            continue
        q = received.tensors.get(weight)
        if q is None or q.dtype not in _FP8 or spec is None:
            problems.append(f"{name}: scale without an FP8 weight {weight}")
            bad.append(name)
        elif tuple(tensor.shape) != scale_inv_shape(q.shape, spec) and tensor.numel() != 1:
            want = list(scale_inv_shape(q.shape, spec))
            problems.append(
                f"{name}: scale shape {list(tensor.shape)}, {received.scheme} needs {want}"
            )
            bad.append(name)
        else:
            received.scales[weight] = tensor.reshape(scale_inv_shape(q.shape, spec))
    for name, tensor in received.tensors.items():
        if tensor.dtype in _FP8 and name not in received.scales and name not in bad:
            problems.append(f"{name}: FP8 weight without its scale")
            bad.append(name)


def _check_finite(received: Received, problems: list[str], bad: list[str]) -> None:
    for name, tensor in list(received.tensors.items()) + list(received.scales.items()):
        count = nonfinite_count(tensor)
        if count:
            problems.append(f"{name}: {count} of {tensor.numel()} values are NaN/Inf")
            bad.append(name)


def collect(buckets: Iterable[Bucket], *, checksums: bool = True) -> Received:
    """Gather and verify all buckets of one refit; raise `RefitError` listing every defect.

    `checksums=False` (the recipe's `refit.verify: false`) skips only the CRC-32 comparison;
    names, shapes, dtypes and finiteness are always checked.
    """
    buckets = list(buckets)
    problems: list[str] = []
    bad: list[str] = []
    _check_buckets(buckets, problems)
    seen: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        _check_entries(bucket, seen, problems, bad, checksums)
    first = buckets[0] if buckets else Bucket(0)
    received = Received(first.scheme, first.scale)
    _split_scales(received, seen, problems, bad)
    _check_finite(received, problems, bad)
    if problems:
        raise RefitError(problems, bad)
    return received
