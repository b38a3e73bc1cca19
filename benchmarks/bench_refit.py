"""Refit bridge throughput and memory on CPU for Llama-3.1-8B-shaped decoder layers.

For each scheme, streams the layers' BF16 weights through `stream_refit` (buckets are consumed
and dropped, as a sender does), then verifies them on the receiver side (`collect`), and
reports source GB/s and the peak resident memory above the weights themselves. The baseline,
measured in the same process, is a plain `clone()` of the same tensors (memory bandwidth):
ratios are bridge time / clone time.

    uv run python benchmarks/bench_refit.py [--layers 1] [--bucket-mb 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import torch

from nemo_fp8_rl.refit import RefitPlan, collect, stream_refit

# Llama-3.1-8B: hidden 4096, 32 heads / 8 KV groups of 128, FFN 14336.
SHAPES = {
    "self_attn.q_proj.weight": (4096, 4096),
    "self_attn.k_proj.weight": (1024, 4096),
    "self_attn.v_proj.weight": (1024, 4096),
    "self_attn.o_proj.weight": (4096, 4096),
    "mlp.gate_proj.weight": (14336, 4096),
    "mlp.up_proj.weight": (14336, 4096),
    "mlp.down_proj.weight": (4096, 14336),
    "input_layernorm.weight": (4096,),
    "post_attention_layernorm.weight": (4096,),
}
SCHEMES = {
    "bf16": ({}, None),
    "block fp32": ({"precision": "fp8"}, None),
    "block pow2": ({"precision": "fp8", "pow2_weight_scaling_factors": True}, None),
    "per-tensor": ({"precision": "fp8"}, "fp8_per_tensor"),
    "per-channel": ({"precision": "fp8"}, "compressed-tensors"),
}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakRSS:
    """Samples resident memory every 2 ms in a thread; `peak` is the maximum seen."""

    def __enter__(self) -> PeakRSS:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _timed(fn: Callable[[], object]) -> tuple[float, int]:
    base = _rss()
    with PeakRSS() as mem:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
    return elapsed, mem.peak - base


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = {
        f"model.layers.{i}.{name}": (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        for i in range(args.layers)
        for name, shape in SHAPES.items()
    }
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    gb = sum(v.numel() * v.element_size() for v in weights.values()) / 1e9
    bucket = args.bucket_mb * 2**20
    print(
        f"{args.layers} Llama-3.1-8B-shaped layer(s): {gb:.3f} GB BF16, bucket {args.bucket_mb} MiB, {args.threads} threads"
    )

    base_t, base_mem = _timed(lambda: [v.clone() for v in weights.values()])
    print(f"baseline clone: {gb / base_t:6.2f} GB/s, peak +{base_mem / 2**20:7.0f} MiB")
    print(
        f"{'scheme':<12} {'send GB/s':>9} {'x clone':>8} {'peak MiB':>9} {'verify GB/s':>11} {'x clone':>8}"
    )
    for label, (vllm_cfg, quant) in SCHEMES.items():
        gen_cfg = {"vllm_cfg": vllm_cfg, "vllm_kwargs": {"quantization": quant} if quant else {}}
        plan = RefitPlan.from_config({"policy": {"generation": gen_cfg}}, shapes)
        send_t, send_mem = _timed(
            lambda plan=plan: sum(1 for _ in stream_refit(weights.items(), plan, bucket))
        )
        buckets = list(stream_refit(weights.items(), plan, bucket))
        verify_t, _ = _timed(lambda buckets=buckets: collect(buckets))
        del buckets
        print(
            f"{label:<12} {gb / send_t:9.2f} {send_t / base_t:8.1f} {send_mem / 2**20:9.0f} "
            f"{gb / verify_t:11.2f} {verify_t / base_t:8.1f}"
        )


if __name__ == "__main__":
    main()
