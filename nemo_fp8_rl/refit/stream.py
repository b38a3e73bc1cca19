"""Streaming refit: HF-named tensors → engine tensors (BF16 or FP8 + scale) in bounded buckets.

Each `Bucket` carries its tensors and a manifest entry per tensor (name, shape, dtype, CRC-32
of the bytes), its index, and whether it is the last one, so a receiver can verify the whole
refit before it applies any of it. Memory: the sender holds at most one bucket plus the
tensors of the parameter being converted (for per-tensor scaling, one fused group: q/k/v or
gate/up share one scale, so their shards are quantized together).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from nemo_fp8_rl.fp8 import count_nonfinite, quantize
from nemo_fp8_rl.refit.errors import RefitError
from nemo_fp8_rl.refit.plan import RefitPlan, fused_group

NamedTensor = tuple[str, torch.Tensor]
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class ManifestEntry:
    """What the receiver must find for one tensor: name, shape, dtype, CRC-32 of its bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    checksum: int

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> ManifestEntry:
        """Describe `tensor` (checksum over its contiguous bytes)."""
        return cls(name, tuple(tensor.shape), dtype_name(tensor.dtype), checksum(tensor))


@dataclass
class Bucket:
    """One transfer unit; picklable, so Ray can ship it.

    torch cannot unpickle float8 tensors (its storage reducer looks up a dtype that untyped
    storages lack), so FP8 tensors travel as uint8 views and are viewed back on arrival.
    """

    index: int
    entries: list[ManifestEntry] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    last: bool = False
    scheme: str = "bf16"
    scale: str = "fp32"

    @property
    def nbytes(self) -> int:
        """Bytes of tensor payload in this bucket."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["tensors"] = {
            name: (t.view(torch.uint8), dtype_name(t.dtype)) if t.dtype in _FP8 else (t, None)
            for name, t in self.tensors.items()
        }
        return state

    def __setstate__(self, state: dict) -> None:
        tensors = state.pop("tensors")
        self.__dict__.update(state)
        self.tensors = {
            name: t.view(getattr(torch, dtype)) if dtype else t
            for name, (t, dtype) in tensors.items()
        }

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append one tensor and its manifest entry."""
        tensor = tensor.detach().contiguous()
        self.entries.append(ManifestEntry.of(name, tensor))
        self.tensors[name] = tensor


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` → `"bfloat16"` (the manifest's dtype spelling)."""
    return str(dtype).removeprefix("torch.")


def checksum(tensor: torch.Tensor) -> int:
    """CRC-32 of the tensor's bytes in row-major order (detects corruption in transit)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return 0
    return zlib.crc32(memoryview(flat.view(torch.uint8).numpy()))


def nonfinite_count(tensor: torch.Tensor) -> int:
    """Number of NaN/Inf values; 0 after one `aminmax` pass when all are finite.

    NaN and ±Inf propagate into min/max, so the exact (much slower) `isfinite` count only runs
    when something is wrong. FP8 tensors: NaN is the byte pattern `x111 1111` (e4m3fn) or the
    exponent-all-ones patterns (e5m2), checked on the raw bytes.
    """
    if tensor.numel() == 0 or not tensor.is_floating_point():
        return 0
    if tensor.dtype in _FP8:
        # Magnitude byte: e4m3fn NaN is 0x7F; e5m2 Inf/NaN are 0x7C..0x7F.
        first_bad = 0x7F if tensor.dtype == torch.float8_e4m3fn else 0x7C
        magnitude = tensor.view(torch.uint8) & 0x7F
        if int(magnitude.amax()) < first_bad:
            return 0
        return int((magnitude >= first_bad).sum())
    low, high = torch.aminmax(tensor)
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return 0
    return count_nonfinite(tensor)


def _check_finite(name: str, tensor: torch.Tensor) -> None:
    bad = nonfinite_count(tensor)
    if bad:
        raise RefitError([f"{name}: {bad} of {tensor.numel()} values are NaN/Inf"], [name])


def _quantize_one(name: str, tensor: torch.Tensor, plan: RefitPlan) -> list[NamedTensor]:
    assert plan.spec is not None
    q, scale_inv = quantize(tensor, plan.spec, name=name, nonfinite="saturate")
    return [(name, q), (plan.scale_name(name), scale_inv.to(torch.float32))]


def _quantize_group(members: list[NamedTensor], plan: RefitPlan) -> list[NamedTensor]:
    """Per-tensor scheme: one scale (the group's max) shared by all shards of a fused module."""
    assert plan.spec is not None
    fused = torch.cat([t for _, t in members], dim=0)
    q, scale_inv = quantize(fused, plan.spec, name=members[0][0], nonfinite="saturate")
    out: list[NamedTensor] = []
    sizes = [t.shape[0] for _, t in members]
    for (name, _), part in zip(members, q.split(sizes), strict=True):
        out += [(name, part.contiguous()), (plan.scale_name(name), scale_inv.clone())]
    return out


class _Converter:
    """Turns source tensors into engine tensors, holding back per-tensor fused groups."""

    def __init__(self, plan: RefitPlan, dtype: torch.dtype | None, check_finite: bool) -> None:
        self.plan, self.dtype, self.check_finite = plan, dtype, check_finite
        self.pending: dict[str, list[tuple[int, str, torch.Tensor]]] = {}
        self.group_sizes: dict[str, int] = {}
        if plan.scheme == "tensor":
            for name in plan.fp8_names:
                group = fused_group(name)
                if group:
                    self.group_sizes[group[0]] = self.group_sizes.get(group[0], 0) + 1

    def convert(self, name: str, tensor: torch.Tensor) -> list[NamedTensor]:
        if name not in self.plan.fp8_names and name not in self.plan.bf16_names:
            raise RefitError(
                [f"{name}: not in the refit plan (the plan was built from other parameter names)"],
                [name],
            )
        if self.check_finite:
            _check_finite(name, tensor)
        if not self.plan.is_fp8(name):
            return [(name, tensor if self.dtype is None else tensor.to(self.dtype))]
        group = fused_group(name)
        if group is None or group[0] not in self.group_sizes:
            return _quantize_one(name, tensor, self.plan)
        members = self.pending.setdefault(group[0], [])
        members.append((group[1], name, tensor))
        if len(members) < self.group_sizes[group[0]]:
            return []
        del self.pending[group[0]]
        members.sort(key=lambda m: m[0])
        return _quantize_group([(n, t) for _, n, t in members], self.plan)

    def finish(self) -> None:
        if self.pending:
            names = [n for members in self.pending.values() for _, n, _ in members]
            raise RefitError(
                [f"{m}: other shards of this fused module never arrived" for m in self.pending],
                names,
            )


def stream_refit(
    named_tensors: Iterable[NamedTensor],
    plan: RefitPlan,
    bucket_bytes: int | None = None,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    check_finite: bool = True,
) -> Iterator[Bucket]:
    """Convert `(hf_name, tensor)` pairs per `plan` and yield them in buckets of ≤ `bucket_bytes`.

    FP8 names become `(name, q)` and `(plan.scale_name(name), scale_inv)` (dequantized value
    = q × scale_inv per tile); other names pass through cast to `dtype` (None keeps the
    source dtype). A tensor larger than the bound gets a bucket of its own. With `check_finite`
    a NaN/Inf source tensor raises `RefitError` naming it before anything of it is sent.
    """
    limit = plan.bucket_bytes if bucket_bytes is None else bucket_bytes
    if limit < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {limit}")
    converter = _Converter(plan, dtype, check_finite)
    bucket = Bucket(0, scheme=plan.scheme, scale=plan.scale)
    for src_name, src in named_tensors:
        for name, tensor in converter.convert(src_name, src.detach()):
            size = tensor.numel() * tensor.element_size()
            if bucket.tensors and bucket.nbytes + size > limit:
                yield bucket
                bucket = Bucket(bucket.index + 1, scheme=plan.scheme, scale=plan.scale)
            bucket.add(name, tensor)
    converter.finish()
    bucket.last = True
    yield bucket
