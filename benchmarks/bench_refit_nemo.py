"""Refit on NeMo RL's path: bytes on the wire, and quantization time, trainer vs generator.

(a) Bytes per refit, from the real shapes (`config.json` of each shipped model, no weights):
    `generator` (NeMo RL today) sends every tensor in BF16 (2 B/element); `trainer` sends each
    weight vLLM holds in FP8 (NeMo RL's default rules: no BF16 layers, no ignored keywords) as
    E4M3 (1 B/element) plus its FP32 `_scale_inv` (4 B per 128x128 block), the rest in BF16.
(b) Quantization time on this CPU: NeMo RL's vLLM-side `cast_tensor_to_fp8_blockwise` (loaded
    from `--nemo-rl-src`, called as its `load_weights` calls it: FP32 input) against the
    project's `quantize_blockwise_like_nemo_rl` (the trainer-side quantizer, chunked CPU path),
    over the FP8 weights of the first `--layers` decoder layers (random BF16 at the real shapes;
    every layer of these models has the same shapes, so the full-model time is the per-layer
    time times the layer count, printed as such). Each tensor is timed `--repeat` times and the
    fastest run counts (a loaded machine only ever adds time). Outputs are checked bit-equal.

    uv run python benchmarks/bench_refit_nemo.py --nemo-rl-src /path/to/nemo-rl [--layers 2]

`--mx` (NeMo RL's `vllm_cfg.is_mx`, NeMo RL 7ea279a): (a) the MXFP8 bytes (E4M3 plus one uint8
E8M0 byte per 1x32 block) beside the block FP8 ones; (b) NeMo RL's `quantize_mxfp8_weight`, which
calls vLLM's `mxfp8_e4m3_quantize` (its CPU path), against the project's
`quantize_mxfp8_like_nemo_rl`, timed the same way and checked byte-equal. It needs vLLM: run it
in the vLLM environment (`.ci/vllm.sh` builds `.venv-vllm`):

    .venv-vllm/bin/python benchmarks/bench_refit_nemo.py --nemo-rl-src /path/to/nemo-rl --mx
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from nemo_fp8_rl.refit.hf_shapes import RECIPE_MODELS, hf_weight_shapes, recipe_model_config
from nemo_fp8_rl.refit.nemo_fp8 import NemoFp8Layout, NemoFp8Rules
from nemo_fp8_rl.refit.nemo_mxfp8 import quantize_mxfp8_like_nemo_rl
from nemo_fp8_rl.refit.nemo_quant import quantize_blockwise_like_nemo_rl
from nemo_fp8_rl.refit.nemo_reference import load_nemo_rl_fp8, nemo_rl_cast
from nemo_fp8_rl.refit.wire_bytes import wire_bytes


def _fastest(fn, repeat: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _pair(module, mx: bool):
    """(NeMo RL's quantizer, the project's) for one weight, block FP8 or MXFP8."""
    if mx:
        return module.quantize_mxfp8_weight, quantize_mxfp8_like_nemo_rl
    return (
        lambda w: nemo_rl_cast(module, w, False),
        lambda w: quantize_blockwise_like_nemo_rl(w, pow2_scale=False),
    )


def time_quantizers(module, config: dict, layers: int, repeat: int, mx: bool = False) -> dict:
    """Fastest-of-`repeat` seconds of NeMo RL's and the project's quantizer over the FP8 weights
    of the first `layers` decoder layers, plus element count and a bit-equality flag."""
    shapes = dict(hf_weight_shapes(config, layers=range(layers), top_level=False))
    layout = NemoFp8Layout(shapes, NemoFp8Rules(num_layers=config["num_hidden_layers"], mx=mx))
    gen = torch.Generator().manual_seed(0)
    nemo = ours = 0.0
    elements, equal = 0, True
    theirs_fn, ours_fn = _pair(module, mx)
    for name in sorted(layout.fp8_names):
        weight = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
        t_nemo, (q1, s1) = _fastest(lambda w=weight: theirs_fn(w), repeat)
        t_ours, (q2, s2) = _fastest(lambda w=weight: ours_fn(w), repeat)
        nemo, ours, elements = nemo + t_nemo, ours + t_ours, elements + weight.numel()
        equal &= torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s1, s2)
    return {"nemo": nemo, "ours": ours, "elements": elements, "equal": equal}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nemo-rl-src", required=True, help="NeMo RL source tree (holds nemo_rl/)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers timed per model")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--models", default="llama-3.1-8b,qwen3-8b", help=", ".join(RECIPE_MODELS))
    parser.add_argument("--mx", action="store_true", help="MXFP8 (is_mx); needs vLLM installed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kind = "MXFP8 pairs (E4M3 + E8M0 per 1x32)" if args.mx else "FP8 pairs (E4M3 + FP32 128x128)"
    print(f"(a) bytes per refit, whole model (trainer = {kind} + BF16 rest; generator = BF16)")
    for model in RECIPE_MODELS:
        trainer, generator, fp8_only = wire_bytes(recipe_model_config(model), mx=args.mx)
        print(
            f"  {model:14s} trainer {trainer / 2**30:6.2f} GiB  generator {generator / 2**30:6.2f}"
            f" GiB  ratio {trainer / generator:.3f} (FP8 weights alone {fp8_only:.4f}; the rest,"
            " embeddings, lm_head, norms, stays BF16)"
        )
    if args.mx:
        import vllm  # noqa: F401  (NeMo RL's quantize_mxfp8_weight calls vLLM's function)
    module = load_nemo_rl_fp8(args.nemo_rl_src)
    print(
        f"(b) {'MXFP8' if args.mx else 'block FP8'} quantization time, CPU, {args.threads} "
        f"thread(s), fastest of {args.repeat}, first {args.layers} layer(s), FP8 weights only, "
        f"NeMo RL tree {args.nemo_rl_src}"
    )
    for model in args.models.split(","):
        config = recipe_model_config(model)
        r = time_quantizers(module, config, args.layers, args.repeat, mx=args.mx)
        per_layer = 1 / args.layers * config["num_hidden_layers"]
        print(
            f"  {model:14s} {r['elements'] / 1e6:7.0f} M elements: NeMo RL {r['nemo']:6.2f} s"
            f" ({r['elements'] / r['nemo'] / 1e6:4.0f} M/s), project {r['ours']:6.2f} s"
            f" ({r['elements'] / r['ours'] / 1e6:4.0f} M/s), NeMo RL / project "
            f"{r['nemo'] / r['ours']:4.1f}x, bit-equal {r['equal']}; whole model (x"
            f"{per_layer:.0f}): NeMo RL {r['nemo'] * per_layer:5.0f} s, project "
            f"{r['ours'] * per_layer:5.0f} s"
        )


if __name__ == "__main__":
    main()
