"""Record Transformer Engine's own reference quantizer outputs for the 4-bit formats.

Runs TE's real Python reference (`transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`
and the two files it imports from that folder) on a fixed set of cases and writes inputs and
outputs to `tests/data/te_fp4_reference.safetensors`, which `tests/test_fp4.py` compares with
`nemo_fp8_rl.fp8.fp4` bit for bit. TE's package cannot be installed here (its extension needs
CUDA), so the three files are loaded from a source tree; the two TE modules they import only for
base classes (`transformer_engine.pytorch.quantized_tensor`, `...tensor.utils`) are declared
stand-ins below, and no function under comparison comes from them.

    git -C <TransformerEngine clone> archive d0067d0da6cb01811b8072a7d304f0e00344ce2b \
        transformer_engine/pytorch/custom_recipes | tar -x -C /tmp/te
    uv run python scripts/te_reference_cases.py --te-src /tmp/te

Cases: NVFP4 through `NVFP4QuantizerRef(...).quantize` (1 x 16 tiles, and the 16 x 16 weight
tiles of TE's default recipe); MXFP4 through `NVFP4QuantizerRef._quantize_blockwise_reference`
with `pow_2_scales=True` (TE's quantize entry point does not run that path at this commit: it
reads an unset `row_input`). Each on the tiny model's weight and activation shapes, ragged
shapes (padding), BF16 and FP32 inputs, zero tiles, outliers, tiny and huge magnitudes, and
tiles built so that scaled values fall exactly on E2M1 rounding ties.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save

from nemo_fp8_rl.config.safe_files import write_atomic

TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "te_fp4_reference.safetensors"
_RECIPES = "transformer_engine/pytorch/custom_recipes"


def _stand_in_modules() -> None:
    """Stand-ins for the two TE modules the reference imports for base classes only."""

    class Quantizer:  # stand-in: TE's base class stores the usage flags and nothing else used here
        def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
            self.rowwise_usage, self.columnwise_usage, self.internal = rowwise, columnwise, False

    class QuantizedTensorStorage:  # stand-in: a plain base for TE's dataclass result
        pass

    pkgs = ["transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.tensor"]
    for name in pkgs:
        sys.modules.setdefault(name, types.ModuleType(name))
    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")
    qt.Quantizer, qt.QuantizedTensorStorage = Quantizer, QuantizedTensorStorage
    utils = types.ModuleType("transformer_engine.pytorch.tensor.utils")
    utils.is_custom = lambda x: getattr(x, "custom", False)
    sys.modules[qt.__name__], sys.modules[utils.__name__] = qt, utils


def load_reference(te_src: Path) -> types.ModuleType:
    """TE's `reference_nvfp4` module, executed from `te_src` (with its real siblings)."""
    _stand_in_modules()
    pkg_name = _RECIPES.replace("/", ".")
    pkg = types.ModuleType(pkg_name)
    pkg.__path__ = [str(te_src / _RECIPES)]
    sys.modules[pkg_name] = pkg
    mod = None
    for leaf in ("reference_utils", "gemm", "reference_nvfp4"):
        path = te_src / _RECIPES / f"{leaf}.py"
        if not path.is_file():
            raise SystemExit(
                f"{path} not found: --te-src must hold {_RECIPES}/ (see the docstring)"
            )
        spec = importlib.util.spec_from_file_location(f"{pkg_name}.{leaf}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        setattr(pkg, leaf, mod)
    return mod


def _tie_tile(cols: int, scale_exp: int) -> torch.Tensor:
    """Rows whose amax is 6 * 2^k, so MXFP4's scale is 2^k exactly and every E2M1 tie and
    grid value (times 2^k) lands where it is; NVFP4 sees near-ties."""
    grid = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0]
    vals = torch.tensor(grid + [-v for v in grid[1:]], dtype=torch.float32)
    reps = -(-cols // len(vals)) * 4
    row = vals.repeat(reps)[: cols * 4].view(4, cols)
    row[:, 0] = 6.0
    return row * 2.0**scale_exp


def cases() -> dict[str, torch.Tensor]:
    """Named inputs (fixed seed): shapes and value patterns named in the module doc."""
    g = torch.Generator().manual_seed(20261203)
    out: dict[str, torch.Tensor] = {}
    shapes = {
        "q_proj": (128, 128),
        "k_proj": (64, 128),
        "up": (384, 128),
        "down": (128, 384),
        "act": (96, 128),
        "ragged": (37, 72),
    }
    for name, shape in shapes.items():
        x = torch.randn(shape, generator=g) * 0.05
        out[f"{name}_f32"] = x
        out[f"{name}_bf16"] = x.to(torch.bfloat16)
    x = torch.randn(64, 128, generator=g)
    x[3, 5], x[40, 100] = 300.0, -1.0e4  # outliers
    out["outliers_f32"] = x
    x = torch.randn(32, 64, generator=g)
    x[:16, :32] = 0.0  # whole zero tiles in every tiling
    out["zero_tiles_f32"] = x
    out["tiny_f32"] = torch.randn(32, 64, generator=g) * 1e-30
    out["huge_f32"] = torch.randn(32, 64, generator=g) * 1e30
    out["ties_f32"] = torch.cat([_tie_tile(64, e) for e in (-3, 0, 2, 5)])
    out["all_zero_f32"] = torch.zeros(16, 32)
    return out


def run(ref: types.ModuleType, xs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TE's outputs: packed E2M1 codes, scales (E4M3 as uint8 bits / FP32) and global amax."""
    e2m1 = ref.reference_utils.Fp4Formats.E2M1
    res: dict[str, torch.Tensor] = {}
    for name, x in xs.items():
        res[f"{name}.input"] = x
        for tile in ((1, 16), (16, 16)):
            q = ref.NVFP4QuantizerRef(e2m1, rowwise=True, columnwise=False, quant_tile_shape=tile)
            t = q.quantize(x)
            key = f"{name}.nvfp4_{tile[0]}x{tile[1]}"
            res[f"{key}.data"] = t.data.contiguous()
            res[f"{key}.scale"] = t.scale.view(torch.uint8).contiguous()
            res[f"{key}.global_amax"] = t.global_amax_row.contiguous()
        padded = ref.NVFP4QuantizerRef._pad_tensor(x, row_divisor=1, col_divisor=32)
        data, scale = ref.NVFP4QuantizerRef._quantize_blockwise_reference(
            padded, None, 32, 1, pow_2_scales=True, eps=0.0
        )
        res[f"{name}.mxfp4_1x32.data"] = data[:, : x.shape[1] // 2].contiguous()
        res[f"{name}.mxfp4_1x32.scale"] = scale.contiguous()
    return res


def main(argv: list[str] | None = None) -> int:
    """Record the cases (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--te-src", type=Path, required=True, help=f"a TE source tree (commit {TE_COMMIT})"
    )
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    ref = load_reference(args.te_src)
    tensors = run(ref, cases())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"te_commit": TE_COMMIT, "script": Path(__file__).name}
    write_atomic(args.out, save(tensors, metadata=meta))  # never through a link
    print(f"{len(tensors)} tensors from TE {TE_COMMIT[:7]} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
