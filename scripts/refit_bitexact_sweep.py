"""Bit-exactness sweep: every FP8 weight of the shipped models against NeMo RL's own quantizer.

For each model config in `nemo_fp8_rl/engines/nemo/model_configs/` (Llama-3.1-8B-Instruct,
Qwen3-8B-Base, Qwen3-4B, Qwen3-30B-A3B by default), layer by layer, every tensor that vLLM holds
in FP8 under NeMo RL's default rules (`NemoFp8Layout`) gets random BF16 values at its real shape
(normal, standard deviation log-uniform in [1e-4, 1], a fresh draw per tensor), and the
project's `quantize_blockwise_like_nemo_rl` must equal NeMo RL's `cast_tensor_to_fp8_blockwise`
(loaded from `--nemo-rl-src`, called as its `load_weights` calls it) bit for bit, E4M3 codes and
FP32 `scale_inv` alike. One tensor is alive at a time, so memory stays bounded (about 1 GB for
Llama's 14336 x 4096 MLP weights, most of it NeMo RL's FP32 temporaries).

`--pow2 alternate` (the default) quantizes each tensor with pow2 scales off or on by turns, so
every tensor is covered once and both rules on every shape; `both` runs each tensor twice.
Prints one line per model (tensors, elements, mismatches, seconds) and exits 1 on any mismatch.

`--mx` sweeps MXFP8 instead (NeMo RL's `is_mx`): the project's `quantize_mxfp8_like_nemo_rl`
against NeMo RL 7ea279a's `quantize_mxfp8_weight`, which calls vLLM's `mxfp8_e4m3_quantize`: run
it where vLLM is installed (the vLLM environment, `.ci/vllm.sh`); codes and E8M0 bytes compared
byte for byte.

`--sample N` covers, instead of every tensor, N tensors of every distinct FP8 shape (spread
evenly over the model's layers; DeepSeek-V3 holds 44 788 FP8 tensors, 655 G elements, beyond a
CPU budget), and says how many of the model's FP8 tensors that is. `--ignored-kws` sets
`quantization_ignored_layer_kws` (default: the recipes' `a_proj,b_proj` for the MLA models,
none for the others; `none` quantizes MLA's low-rank projections too, so their shapes are swept).

    uv run python scripts/refit_bitexact_sweep.py --nemo-rl-src /path/to/nemo-rl [--models qwen3-4b]
    uv run python scripts/refit_bitexact_sweep.py --nemo-rl-src ... --models deepseek-v3 --sample 2
    .venv-vllm/bin/python scripts/refit_bitexact_sweep.py --nemo-rl-src ... --mx --models qwen3-4b
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator

import torch

from nemo_fp8_rl.refit.hf_shapes import RECIPE_MODELS as MODELS
from nemo_fp8_rl.refit.hf_shapes import hf_weight_shapes, is_mla, recipe_model_config
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules
from nemo_fp8_rl.refit.nemo_mxfp8 import quantize_mxfp8_like_nemo_rl
from nemo_fp8_rl.refit.nemo_quant import quantize_blockwise_like_nemo_rl
from nemo_fp8_rl.refit.nemo_reference import load_nemo_rl_fp8, nemo_rl_cast


def same_bits(
    ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor]
) -> bool:
    """E4M3 codes equal byte for byte, scales equal bit for bit (NaN scales: NaN in both)."""
    (q1, s1), (q2, s2) = ours, theirs
    if q1.shape != q2.shape or s1.shape != s2.shape or q1.dtype != q2.dtype or s1.dtype != s2.dtype:
        return False
    if not torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)):
        return False
    if s1.dtype == torch.uint8:  # MXFP8's E8M0 bytes
        return bool(torch.equal(s1, s2))
    nan1, nan2 = torch.isnan(s1), torch.isnan(s2)
    bits_equal = s1.view(torch.int32) == s2.view(torch.int32)
    return bool(torch.equal(nan1, nan2) and (bits_equal | nan1).all())


def fp8_weights(config: dict, rules: NemoFp8Rules) -> Iterator[tuple[int, str, tuple]]:
    """(layer, name, shape) of every weight vLLM holds in FP8, layer by layer."""
    for layer in range(config["num_hidden_layers"]):
        shapes = dict(hf_weight_shapes(config, layers=[layer], top_level=False))
        layout = NemoFp8Layout(shapes, rules)
        for name in sorted(layout.fp8_names):
            yield layer, name, shapes[name]


def sampled(weights: list[tuple[int, str, tuple]], per_shape: int) -> set[str]:
    """`per_shape` names of every distinct shape, spread evenly over the list."""
    by_shape: dict[tuple, list[str]] = {}
    for _, name, shape in weights:
        by_shape.setdefault(tuple(shape), []).append(name)
    picked = set()
    for names in by_shape.values():
        step = max(1, len(names) // per_shape)
        picked.update(names[::step][:per_shape])
    return picked


def _modes(pow2_mode: str, count: int, mx: bool) -> tuple:
    if mx:
        return ("mx",)
    if pow2_mode == "both":
        return (False, True)
    return ({"off": False, "on": True}.get(pow2_mode, count % 2 == 1),)


def _compare(module, weight: torch.Tensor, mode) -> bool:
    if mode == "mx":
        return same_bits(quantize_mxfp8_like_nemo_rl(weight), module.quantize_mxfp8_weight(weight))
    ours = quantize_blockwise_like_nemo_rl(weight, pow2_scale=mode)
    return same_bits(ours, nemo_rl_cast(module, weight, mode))


def sweep_model(
    module,
    config: dict,
    pow2_mode: str,
    gen: torch.Generator,
    ignored: tuple,
    sample: int,
    mx: bool = False,
) -> dict:
    """Compare the FP8 weights of one model (all, or `sample` per shape); counts, mismatches."""
    rules = NemoFp8Rules(num_layers=config["num_hidden_layers"], ignored_keywords=ignored, mx=mx)
    weights = list(fp8_weights(config, rules))
    keep = sampled(weights, sample) if sample else {n for _, n, _ in weights}
    count = elements = 0
    mismatches: list[str] = []
    shapes_seen: set[tuple] = set()
    for layer in range(config["num_hidden_layers"]):
        shapes = {n: s for ly, n, s in weights if ly == layer and n in keep}
        for name in sorted(shapes):
            std = 10 ** (-4 * torch.rand((), generator=gen).item())
            weight = (torch.randn(shapes[name], generator=gen) * std).to(torch.bfloat16)
            for mode in _modes(pow2_mode, count, mx):
                if not _compare(module, weight, mode):
                    mismatches.append(f"{name} {'mx' if mx else f'pow2={mode}'}")
            count += 1
            elements += weight.numel()
            shapes_seen.add(tuple(shapes[name]))
            del weight
        if shapes:
            print(
                f"  layer {layer}: {count} tensors, {len(mismatches)} mismatches",
                file=sys.stderr,
                flush=True,
            )
    total = sum(math.prod(s) for _, _, s in weights)
    return {
        "tensors": count,
        "elements": elements,
        "mismatches": mismatches,
        "of_tensors": len(weights),
        "of_elements": total,
        "shapes": len(shapes_seen),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nemo-rl-src", required=True, help="NeMo RL source tree (holds nemo_rl/)")
    parser.add_argument("--models", default="all", help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--pow2", choices=("alternate", "off", "on", "both"), default="alternate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample", type=int, default=0, help="tensors per distinct shape (0: all)")
    parser.add_argument("--mx", action="store_true", help="MXFP8 (is_mx; needs vLLM installed)")
    parser.add_argument(
        "--ignored-kws",
        default=None,
        help="comma list of quantization_ignored_layer_kws, or none (default: a_proj,b_proj for "
        "MLA models, none otherwise)",
    )
    args = parser.parse_args(argv)
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: use {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    module = load_nemo_rl_fp8(args.nemo_rl_src)
    gen = torch.Generator().manual_seed(args.seed)
    failed = False
    for name in names:
        config = recipe_model_config(name)
        ignored = _ignored(args.ignored_kws, config)
        start = time.perf_counter()
        result = sweep_model(module, config, args.pow2, gen, ignored, args.sample, args.mx)
        seconds = time.perf_counter() - start
        failed |= bool(result["mismatches"])
        print(
            f"{name}: {result['tensors']} FP8 tensors of {result['of_tensors']} "
            f"({result['shapes']} distinct shapes), {result['elements'] / 1e9:.2f} of "
            f"{result['of_elements'] / 1e9:.2f} G elements, ignored {list(ignored)}, "
            f"{'MXFP8' if args.mx else f'pow2 {args.pow2}'}, {len(result['mismatches'])} "
            f"mismatches, {seconds:.0f} s"
            + (f" (first: {result['mismatches'][:3]})" if result["mismatches"] else ""),
            flush=True,
        )
    return 1 if failed else 0


def _ignored(flag: str | None, config: dict) -> tuple[str, ...]:
    """The ignored keywords for one model: the flag's, or the recipes' default."""
    if flag is None:
        return ("a_proj", "b_proj") if is_mla(config) else ()
    return () if flag == "none" else tuple(k for k in flag.split(",") if k)


if __name__ == "__main__":
    sys.exit(main())
