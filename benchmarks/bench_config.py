"""Time to load and validate every recipe, against the time to only parse their YAML files.

Run: `uv run python benchmarks/bench_config.py`. Prints seconds and the ratio of full validation
(defaults chain, interpolation, schema, rules) to plain YAML parsing of the same files.
"""

from __future__ import annotations

import time

import yaml

from nemo_fp8_rl.config import find_recipes, load_recipe
from nemo_fp8_rl.config.recipe import project_root


def best_of(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    recipes = find_recipes()
    files = sorted(project_root().glob("configs/**/*.yaml")) + recipes
    cold_start = time.perf_counter()
    for path in recipes:
        load_recipe(path)
    cold = time.perf_counter() - cold_start
    parse = best_of(lambda: [yaml.safe_load(p.read_text()) for p in files])
    warm = best_of(lambda: [load_recipe(p) for p in recipes])
    print(f"recipes: {len(recipes)}  yaml files: {len(files)}")
    print(f"plain YAML parse of all files   {parse * 1e3:8.1f} ms  (baseline)")
    print(f"load+validate all, first time   {cold * 1e3:8.1f} ms  ratio {cold / parse:6.1f}x")
    print(f"load+validate all, warm         {warm * 1e3:8.1f} ms  ratio {warm / parse:6.1f}x")


if __name__ == "__main__":
    main()
