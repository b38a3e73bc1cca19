"""Recipe load time against the recipe's size: loading must be linear in the number of keys.

Run: `uv run python benchmarks/bench_config_size.py [--keys 2000 20000]`. Writes recipes that
inherit the tiny BF16 recipe and add N keys under `env` (a free-form section, so each key is
parsed, merged with provenance, interpolated and checked), and times `load_recipe` (best of 3).
Prints seconds per size and, for each size against the smallest, the time ratio divided by the
key ratio: about 1 means linear, about N_large / N_small would mean quadratic. The fixed cost
(the tiny recipe's own chain) makes the ratio slightly below 1.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.recipe import project_root
from nemo_fp8_rl.config.safe_files import write_atomic


def write_recipe(folder: Path, keys: int) -> Path:
    """A recipe with `keys` extra leaf keys (`env.k<i>: <i>`)."""
    parent = project_root() / "recipes/tiny/grpo-tiny-qwen3-cpu-bf16.yaml"
    path = folder / f"keys-{keys}.yaml"
    lines = [f"defaults: {parent}", "env:", *(f"  k{i}: {i}" for i in range(keys))]
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def best_of(path: Path, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        path.touch()  # a new mtime: the parsed-file cache does not answer
        start = time.perf_counter()
        load_recipe(path)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, nargs="+", default=[2000, 5000, 20000])
    args = parser.parse_args()
    sizes = sorted(args.keys)
    with tempfile.TemporaryDirectory() as tmp:
        seconds = {n: best_of(write_recipe(Path(tmp), n)) for n in sizes}
    base = sizes[0]
    print(f"{'keys':>8}  {'load s':>8}  {'ratio vs ' + str(base):>14}  {'ratio / key ratio':>17}")
    for n in sizes:
        ratio = seconds[n] / seconds[base]
        print(f"{n:8d}  {seconds[n]:8.3f}  {ratio:14.2f}  {ratio / (n / base):17.2f}")


if __name__ == "__main__":
    main()
