"""Build the shipped warm-ups (starting policies) of a CPU recipe for some seeds.

    uv run python scripts/build_warmups.py --recipe recipes/study/grpo-study-bf16.yaml --seeds 1-5

Runs the recipe's supervised warm-up (`local.warmup`) for each seed exactly as a training run
would (same model initialisation, same thread count) and writes it to the shipped store,
`data/warmup/<config key>/` (`nemo_fp8_rl.tiny.warmup_store`), where every run of a
recipe with the same model, task and warm-up settings finds it on any machine. An existing
entry is kept unless `--rebuild`. Prints one line per seed: key, steps, held-out accuracy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.runs.seeds import parse_seeds
from nemo_fp8_rl.tiny import warmup_store
from nemo_fp8_rl.tiny.model import build_model, quiet_transformers, untied_state
from nemo_fp8_rl.tiny.tokenizer import build_tokenizer
from nemo_fp8_rl.tiny.warmup import train_warmup


def build(local: LocalConfig, seed: int, out: Path, rebuild: bool) -> str:
    """Warm up the seed's model and store it under `out/<config key>`; one line of summary."""
    tokenizer = build_tokenizer()
    key = warmup_store.config_key(local, seed, tokenizer.get_vocab())
    folder = out / key
    if (folder / "model.safetensors").exists() and not rebuild:
        return f"seed {seed}: {folder} exists (kept)"
    model = build_model(local.model, tokenizer, seed)
    t0 = time.perf_counter()
    result = train_warmup(model, tokenizer, local, seed)
    meta = {
        "seed": seed,
        "steps": result["steps"],
        "accuracy": result["accuracy"],
        "checks": result["checks"],
        "final_loss": result["losses"][-1] if result["losses"] else None,
        "config": {
            "model": local.model.model_dump(),
            "task": local.task.model_dump(),
            "warmup": local.warmup.model_dump(),
        },
        "built_with": warmup_store.numerics(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    warmup_store.save(folder, untied_state(model), meta)
    return f"seed {seed}: {folder} steps {result['steps']} accuracy {result['accuracy']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, default=Path("recipes/study/grpo-study-bf16.yaml"))
    ap.add_argument("--seeds", type=parse_seeds, default=[1, 2, 3, 4, 5], help="e.g. 1-5")
    ap.add_argument("--out", type=Path, default=warmup_store.shipped_root())
    ap.add_argument("--rebuild", action="store_true", help="replace existing entries")
    args = ap.parse_args(argv)
    local = LocalConfig(**load_recipe(args.recipe).config["local"])
    torch.set_num_threads(local.num_threads)
    quiet_transformers()
    for seed in args.seeds:
        print(build(local, seed, args.out, args.rebuild), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
