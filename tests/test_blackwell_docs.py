"""docs/cluster.md's Blackwell numbers are what the committed scripts give from committed data.

- the MXFP8 run tables: `scripts/loop_run_table.py` on the archived runs (docs/blackwell/runs/:
  NeMo RL's loop on CPU and the embedded engine);
- the MXFP8 bytes per refit: `refit.wire_bytes.wire_bytes(config, mx=True)` of each model's
  shipped config.json (the times beside them are a loaded machine's, from
  `benchmarks/bench_refit_nemo.py --mx`, and are not regenerated here);
- every recipe the GPU table names exists.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from nemo_fp8_rl.refit.hf_shapes import recipe_model_config
from nemo_fp8_rl.refit.wire_bytes import wire_bytes

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cluster.md"
RUNS = ROOT / "docs" / "blackwell" / "runs"
TABLES = {  # docs block marker -> archived run
    "mxfp8-loop-table": RUNS / "grpo-tiny-qwen3-nemo-cpu-fp8-mxfp8",
    "mxfp8-embedded-table": RUNS / "grpo-tiny-qwen3-cpu-fp8-mxfp8",
}
MODELS = {
    "Llama 3.1 8B": "llama-3.1-8b",
    "Qwen3-8B": "qwen3-8b",
    "Qwen3-4B": "qwen3-4b",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mxfp8_run_tables_are_the_archived_runs() -> None:
    text = DOC.read_text(encoding="utf-8")
    for marker, run in TABLES.items():
        begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
        (block,) = re.findall(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), text, re.DOTALL)
        assert block.strip() == _script("loop_run_table").table(run)
        recipe = (run / "recipe.yaml").read_text()
        assert recipe.count("is_mx: true") == 1 and recipe.count("fp8_recipe: mxfp8") == 1


def test_mxfp8_bytes_per_refit_are_wire_bytes() -> None:
    text = DOC.read_text(encoding="utf-8")
    for label, key in MODELS.items():
        trainer, generator, _ = wire_bytes(recipe_model_config(key), mx=True)
        row = f"| {label} | {trainer / 2**30:.2f} GiB | {generator / 2**30:.2f} GiB | "
        assert row + f"{trainer / generator:.3f} |" in text, row


def test_recipes_the_gpu_table_names_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Which recipe on which GPU", 1)[1].split("\n### ", 1)[0]
    names = set(re.findall(r"`(grpo-[a-z0-9.\-]+-\d+n\dg)-\*`", section))
    assert len(names) == 8
    recipes = {p.stem for p in (ROOT / "recipes").rglob("*.yaml")}
    for name in names:
        assert any(r.startswith(name + "-") for r in recipes), name
