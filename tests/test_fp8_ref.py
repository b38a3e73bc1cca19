"""Independent, deliberately plain FP8 reference used by the fp8 tests (imported as `test_fp8_ref`).

Element rounding is done by enumerating every finite value of the format and picking the nearest
(ties to an even code), scales with numpy float32 scalars, tiles with explicit Python loops.
Nothing here calls the package under test.
"""

from __future__ import annotations

import math

import numpy as np
import torch

FMT = {  # name: (exponent bits, mantissa bits, bias, max finite, has inf)
    "e4m3": (4, 3, 7, 448.0, False),
    "e5m2": (5, 2, 15, 57344.0, True),
}
_TORCH_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_VALUES: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def finite_values(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """All non-negative finite values of `fmt`, ascending, with their codes (mantissa parity = code parity)."""
    if fmt not in _VALUES:
        ebits, mbits, bias, vmax, _ = FMT[fmt]
        vals, codes = [], []
        for code in range(1 << (ebits + mbits)):
            e, m = code >> mbits, code & ((1 << mbits) - 1)
            v = m * 2.0 ** (1 - bias - mbits) if e == 0 else (1 + m / 2**mbits) * 2.0 ** (e - bias)
            if v <= vmax:
                vals.append(v)
                codes.append(code)
        _VALUES[fmt] = (np.array(vals), np.array(codes))
    return _VALUES[fmt]


def round_scalar(y: float, fmt: str) -> float:
    """Saturating round-to-nearest-even of one float into `fmt` (NaN stays NaN)."""
    if math.isnan(y):
        return math.nan
    vals, codes = finite_values(fmt)
    a = min(abs(y), FMT[fmt][3])
    i = int(np.searchsorted(vals, a))
    if i == len(vals) or vals[i] != a:
        lo, hi = i - 1, min(i, len(vals) - 1)
        d_lo, d_hi = a - vals[lo], vals[hi] - a
        i = lo if d_lo < d_hi or (d_lo == d_hi and codes[lo] % 2 == 0) else hi
    return math.copysign(float(vals[i]), y)


def round_array(y: np.ndarray, fmt: str) -> np.ndarray:
    """Vectorised `round_scalar`: nearest finite value, ties to the even code, saturating."""
    vals, codes = finite_values(fmt)
    a = np.minimum(np.abs(y.astype(np.float64)), FMT[fmt][3])
    hi = np.clip(np.searchsorted(vals, a), 0, len(vals) - 1)
    lo = np.clip(hi - 1, 0, len(vals) - 1)
    d_lo, d_hi = a - vals[lo], vals[hi] - a
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (codes[lo] % 2 == 0))
    out = np.where(vals[hi] == a, vals[hi], np.where(pick_lo, vals[lo], vals[hi]))
    out = np.copysign(out, y)
    return np.where(np.isnan(y), np.nan, out)


def ref_scale(amax: float, fp8_max: float, pow2: bool, eps: float = 0.0) -> tuple[float, float]:
    """Scale and scale_inv for one tile, written from TE's compute_scale_from_amax rules."""
    a = np.float32(amax)
    if a < np.float32(eps):
        a = np.float32(eps)
    if a == 0 or math.isinf(a) or math.isnan(a):
        return 1.0, 1.0
    with np.errstate(over="ignore"):
        s = np.float32(fp8_max) / a
    if math.isinf(s):
        s = np.finfo(np.float32).max
    if pow2:
        s = np.float32(math.ldexp(1.0, math.frexp(float(s))[1] - 1))
    return float(s), float(np.float32(1.0) / np.float32(s))


def ref_e8m0_scale(amax: float, fp8_max: float) -> tuple[float, float]:
    """MXFP8 (TE): v = amax * fp32(1/fp8_max); e = clamp(ceil(log2 v) + 127, 0, 254) (NaN 255,
    inf 254); scale = 1 if e == 0 else 2^(127-e); scale_inv = 2^(e-127)."""
    v = np.float32(amax) * np.float32(1.0 / fp8_max)
    if math.isnan(v):
        return math.nan, math.nan
    if math.isinf(v):
        e = 254
    elif v == 0:
        e = 0
    else:
        mant, ex = math.frexp(float(v))  # v = mant * 2^ex, mant in [0.5, 1)
        e = min(max((ex - 1 if mant == 0.5 else ex) + 127, 0), 254)
    return (1.0 if e == 0 else math.ldexp(1.0, 127 - e)), math.ldexp(1.0, e - 127)


def block_shape(granularity: str, m: int, k: int) -> tuple[int, int]:
    return {
        "tensorwise": (m, k),
        "per_channel": (1, k),
        "rowwise": (1, 128),
        "blockwise": (128, 128),
        "mxfp8": (1, 32),
    }[granularity]


def ref_quantize(x: torch.Tensor, fmt: str, granularity: str, pow2: bool, eps: float = 0.0):
    """Per-tile loop reference. Returns (q as float64 values, scale_inv grid (Mb, Kb) float32)."""
    k = x.shape[-1] if x.dim() else 1
    x2 = x.reshape(-1, k).to(torch.float32).numpy()
    m = x2.shape[0]
    br, bc = block_shape(granularity, m, k)
    fp8_max = FMT[fmt][3]
    mb, kb = math.ceil(m / br), math.ceil(k / bc)
    q = np.zeros_like(x2, dtype=np.float64)
    sinv = np.zeros((mb, kb), dtype=np.float32)
    for bi in range(mb):
        for bj in range(kb):
            tile = x2[bi * br : (bi + 1) * br, bj * bc : (bj + 1) * bc]
            mags = np.abs(tile[~np.isnan(tile)])
            amax = float(mags.max()) if mags.size else 0.0
            if granularity == "mxfp8":
                s, s_inv = ref_e8m0_scale(amax, fp8_max)
            else:
                s, s_inv = ref_scale(amax, fp8_max, pow2, eps)
            sinv[bi, bj] = s_inv
            y = tile.astype(np.float32) * np.float32(s)
            q[bi * br : (bi + 1) * br, bj * bc : (bj + 1) * bc] = round_array(y, fmt)
    return q.reshape(x.shape), sinv
