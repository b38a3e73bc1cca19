"""No shipped recipe triggers the project's own pre-launch warnings unless its comment says why.

A recipe that must run against a warning declares it in a comment of a file of its chain:
`# expected warning: <rule>: <why>` (the rule as the guard report names it, e.g.
`memory/kv-sizing`). Checked on both vendored NeMo RL snapshots, workers' GPU unnamed.
"""

# ruff: noqa: F811  (the fixture `trees` is imported from guards_fixtures)
from __future__ import annotations

from pathlib import Path

import pytest
from guards_fixtures import report, trees  # noqa: F401 (the fixture `trees`)

from nemo_fp8_rl.config import find_recipes, load_recipe, short_name

MARK = "expected warning: "


def declared(recipe: str, overrides: tuple[str, ...] = ()) -> set[str]:
    """The rules the files of `recipe`'s chain declare in `# expected warning: <rule>:` comments."""
    loaded = load_recipe(recipe, list(overrides))
    files = {Path(loaded.path)} | {Path(s) for s in loaded.provenance.values() if Path(s).is_file()}
    out = set()
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("#") and MARK in line:
                out.add(line.split(MARK, 1)[1].split(":", 1)[0].strip())
    return out


def undeclared(recipe: str, tree: Path, overrides: tuple[str, ...] = ()) -> list[str]:
    """`rule: what` of each warning of `recipe` that its chain does not declare."""
    known = declared(recipe, overrides)
    found = report(recipe, overrides, tree=tree).warnings
    return [f"{f.rule}: {f.what}" for f in found if f.rule not in known]


@pytest.mark.parametrize("snapshot", ["v0.7.0", "7ea279a"])
def test_no_shipped_recipe_triggers_an_undeclared_warning(trees, snapshot):
    found = {
        short_name(path): undeclared(str(path), trees[snapshot])
        for path in find_recipes()
        if load_recipe(path).config["cluster"]["gpus_per_node"]
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_an_unpinned_colocated_fp8_recipe_is_caught(trees):
    """Without its KV-cache pin a colocated FP8 recipe gets the KV-sizing warning on vLLM 0.25,
    and no comment of its chain declares it."""
    unpinned = ("~policy.generation.vllm_kwargs.kv_cache_memory_bytes",)
    found = undeclared("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", trees["7ea279a"], unpinned)
    assert [f.split(":")[0] for f in found] == ["memory/kv-sizing"]
