"""NeMo RL's `defaults:` composition of a config file, and the dotted keys of composed trees.

`compose(path)` is `nemo_rl.utils.config.load_config_with_inheritance` without OmegaConf: the
parents named by `defaults:` (a path or a list, relative to the file) are composed depth-first,
left to right, then the file's own keys are merged over them (dicts merge, lists and scalars
replace); `_override_: true` replaces a top-level section, and deeper NeMo RL ignores it (the
section merges), so the marker is dropped there. Interpolations are left as written. Every leaf
keeps the file that set it (provenance), so a caller can tell NeMo RL's base configs from the
recipe files over them.

Used by `recipes import` (`nemo_import`), by the preflight's NeMo RL config yardsticks
(`engines/nemo/preflight`: `exemplars` and `upstream_recipes`) and held to NeMo RL's own loader
on every GRPO config of both vendored snapshots (tests/test_nemo_import.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.interpolate import is_missing, lookup
from nemo_fp8_rl.config.loader import (
    Provenance,
    count_load,
    leaf_sources,
    merge,
    parent_list,
    read_yaml,
)
from nemo_fp8_rl.config.locations import resolve_parent


def compose(
    path: Path,
    seen: tuple[Path, ...] = (),
    loads: list[int] | None = None,
    files: list[Path] | None = None,
) -> tuple[dict, Provenance]:
    """`path` over its `defaults:` parents (module docstring): the tree and each leaf's file.

    Bounded as a recipe's chain is (`loader.count_load`: its depth, cycles, and the files
    resolved in all, `loads` shared down the recursion: three files each listing the next 40
    times would otherwise compose 64,000 times); every file composed is appended to `files`."""
    loads = [0] if loads is None else loads
    count_load(path, seen, loads)
    if files is not None:
        files.append(path)
    data = read_yaml(path)
    merged: dict = {}
    prov: Provenance = {}
    for parent in parent_list(data.pop("defaults", None), path):
        pdata, pprov = compose(resolve_parent(parent, path).resolve(), (*seen, path), loads, files)
        merged, prov = merge(merged, prov, pdata, pprov)
    for key, value in data.items():
        if isinstance(value, dict):
            data[key] = _drop_nested_markers(value, top=True)
    return merge(merged, prov, data, leaf_sources(data, str(path)))


def _drop_nested_markers(node: dict, top: bool = False) -> dict:
    out = {k: _drop_nested_markers(v) if isinstance(v, dict) else v for k, v in node.items()}
    if not top:
        out.pop("_override_", None)
    return out


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaf key -> value (an empty dict is a leaf; lists are values)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(leaves(value, dotted))
        else:
            out[dotted] = value
    return out


def has_key(tree: dict[str, Any], dotted: str) -> bool:
    """Whether the nested dict `tree` holds the dotted key (any value, `null` included)."""
    return not is_missing(lookup(tree, dotted))
