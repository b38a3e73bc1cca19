"""Blockwise FP8 quantization throughput vs a large memory copy measured in the same run.

CPU (default): Llama-3.1-8B-shaped BF16 weights (4096x14336 and 14336x4096), each
implementation timed best-of-N, reported in GB/s of BF16 input and as a ratio to the bandwidth of
a 1 GiB FP32 `copy_` (bytes copied per second) measured in this process. All implementations are
checked to give identical codes and scales.

GPU (`--device cuda`, run by scripts/gpu_check.sh): the fused Triton kernel and the torch tiled
path, against an HBM copy measured the same way.

    uv run python benchmarks/bench_quant.py [--threads 1] [--repeats 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from nemo_fp8_rl.fp8 import FP8Spec
from nemo_fp8_rl.fp8.fast import quantize_chunked
from nemo_fp8_rl.fp8.quantize import quantize_tiles

SHAPES = [(4096, 14336), (14336, 4096)]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_time(fn: Callable[[], object], repeats: int, device: str) -> tuple[float, float]:
    """Best wall time and best process CPU time of `repeats` calls (after a warm-up call), in s.

    CPU time excludes the time the process waits for a core, so on a shared machine it is the
    steadier measure (meaningful for one thread: with more it sums over threads)."""
    fn()
    _sync(device)
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu


def copy_bandwidth(device: str, repeats: int, gib: float = 1.0) -> tuple[float, float]:
    """GB/s of a large FP32 `copy_` (bytes copied / second; each byte is read once, written
    once), by wall time and by CPU time."""
    n = int(gib * (1 << 30)) // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    wall, cpu = best_time(lambda: dst.copy_(src), repeats, device)
    return n * 4 / wall / 1e9, n * 4 / max(cpu, 1e-9) / 1e9


def implementations(device: str) -> dict[str, Callable]:
    """Name -> quantize function (x, spec) -> (q, scale_inv) for the device."""
    impls: dict[str, Callable] = {"tiles (reshape, torch)": quantize_tiles}
    if device == "cpu":
        impls["chunked (fast path)"] = quantize_chunked
    else:
        from nemo_fp8_rl.fp8.triton_quant import quantize_blockwise_triton

        impls["triton kernel"] = quantize_blockwise_triton
    return impls


def run(device: str, repeats: int, spec_name: str) -> None:
    """Print one table row per (shape, implementation), plus the copy baseline."""
    spec = FP8Spec.preset(spec_name)
    copy_gbs, copy_cpu_gbs = copy_bandwidth(device, repeats)
    print(f"device={device} threads={torch.get_num_threads()} spec={spec_name}")
    cpu_note = f", {copy_cpu_gbs:.2f} GB/s CPU time" if device == "cpu" else ""
    print(f"memory copy (1 GiB fp32 copy_): {copy_gbs:.2f} GB/s wall{cpu_note}")
    print(
        f"{'shape':>12}  {'implementation':<24} {'ms':>9} {'GB/s':>8} {'vs copy':>8}"
        f" {'cpu GB/s':>9} {'vs copy':>8}  exact"
    )
    for m, k in SHAPES:
        x = torch.randn(m, k, device=device).to(torch.bfloat16)
        ref = None
        for name, fn in implementations(device).items():
            q, s = fn(x, spec)
            if ref is None:
                ref, exact = (q, s), "ref"
            else:
                same = torch.equal(q.view(torch.uint8), ref[0].view(torch.uint8))
                exact = "yes" if same and torch.equal(s, ref[1]) else "NO"
            t, t_cpu = best_time(lambda fn=fn, x=x: fn(x, spec), repeats, device)
            gbs, cpu_gbs = x.numel() * 2 / t / 1e9, x.numel() * 2 / max(t_cpu, 1e-9) / 1e9
            cpu_cols = (
                f"{cpu_gbs:9.3f} {cpu_gbs / copy_cpu_gbs:8.1%}" if device == "cpu" else " " * 18
            )
            print(
                f"{m:>5}x{k:<6}  {name:<24} {t * 1e3:9.2f} {gbs:8.3f} {gbs / copy_gbs:8.1%}"
                f" {cpu_cols}  {exact}"
            )


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--spec", default="blockwise", help="FP8Spec preset (blockwise, blockwise_pow2)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    run(args.device, args.repeats, args.spec)


if __name__ == "__main__":
    main()
