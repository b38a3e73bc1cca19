"""Load a recipe: the `defaults:` chain with NeMo RL's semantics, overrides, provenance, interpolation.

Semantics (as `nemo_rl.utils.config.load_config_with_inheritance`):
- `defaults:` is a path or a list of paths, relative to the file that names them; parents are
  resolved depth-first and merged left to right, then the file's own keys last. Beyond NeMo RL,
  an entry that is no file may be a recipe's or config's short name (`locations.resolve_parent`);
- dicts merge key by key; lists and scalars replace; a dict with `_override_: true` replaces the
  inherited dict instead of merging into it;
- `${a.b}` (absolute), `${.x}` (relative to the enclosing section) and the resolvers `add`, `mul`,
  `div`, `max` (`${mul:${a}, 2}`) are resolved after the merge.
Every leaf key remembers the file (or "override") that last set it.

Overrides follow Hydra's syntax as NeMo RL applies it (`parse_hydra_overrides`), left to right:
`a.b=v` sets a key (the value read as YAML), `+a.b=v` adds one the recipe does not have
(refused on a key it has, as Hydra refuses it) and `++a.b=v` adds or sets one; the schema, not
the prefix, decides what may exist. `~a.b` deletes a key and `~a.b=v` deletes it only if its
value is `v` (a key of the base config cannot be deleted: every one is required). Deleting a key that is not there is an error, as in Hydra (which, unlike this loader,
also refuses to delete a key whose value is null).
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.locations import resolve_parent
from nemo_fp8_rl.config.safe_yaml import parse_yaml, read_text
from nemo_fp8_rl.config.user_error import shown

__all__ = [
    "apply_overrides",
    "count_load",
    "leaf_sources",
    "load_chain",
    "load_parents",
    "merge",
    "parent_list",
    "parse_yaml",
]

# Deeper `defaults:` chains are refused (real ones are 3-5 files; each level costs a merge).
MAX_CHAIN_DEPTH = 32
# A recipe resolving more parent files than this in all is refused (real ones resolve fewer than
# 10): three files each listing the next 40 times would otherwise merge 64,000 times.
MAX_PARENT_LOADS = 256

Provenance = dict[str, str]


def read_yaml(path: Path) -> dict:
    """Read one YAML mapping file (parsed once per file version, returned as a fresh copy)."""
    if not path.exists():
        raise RecipeError(
            str(path), [Problem("<file>", "file not found", "check the path", str(path))]
        )
    if not path.is_file():
        read_text(path)  # refuses a folder, a FIFO or a device, by name
    stat = path.stat()
    return copy.deepcopy(_read_cached(str(path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=256)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict:
    data = parse_yaml(read_text(Path(path)), path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(
            path,
            [Problem("<file>", "top level is not a mapping", "write `key: value` lines", path)],
        )
    return data


def leaf_sources(data: Any, source: str, prefix: str = "") -> Provenance:
    """Provenance of every leaf of `data` (empty dicts and lists count as leaves)."""
    if isinstance(data, dict) and data:
        out: Provenance = {}
        for key, value in data.items():
            if key != "_override_":
                out.update(leaf_sources(value, source, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): source}


def merge(
    base: dict, base_prov: Provenance, update: dict, update_prov: Provenance
) -> tuple[dict, Provenance]:
    """Merge `update` over `base`: dicts merge, lists and scalars replace, `_override_: true` replaces."""
    out, prov = copy.deepcopy(base), dict(base_prov)
    _merge_into(out, prov, update, update_prov, "")
    return out, prov


def _merge_into(
    out: dict, prov: Provenance, update: dict, update_prov: Provenance, prefix: str
) -> None:
    """Merge in place; provenance is updated by walking only the replaced subtrees (linear)."""
    for key, value in update.items():
        path = f"{prefix}{key}"
        replace = isinstance(value, dict) and value.get("_override_") is True
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not replace:
            _merge_into(out[key], prov, value, update_prov, f"{path}.")
            continue
        if replace:
            value = {k: v for k, v in value.items() if k != "_override_"}
        if key in out:
            for stale in leaf_sources(out[key], "", f"{path}."):
                prov.pop(stale, None)
        out[key] = copy.deepcopy(value)
        for leaf in leaf_sources(value, "", f"{path}."):
            if leaf in update_prov:
                prov[leaf] = update_prov[leaf]


def load_chain(
    path: Path, seen: tuple[Path, ...] = (), loads: list[int] | None = None
) -> tuple[dict, Provenance]:
    """Resolve `path` with its `defaults:` chain (depth-first, parents left to right, file last).

    `loads` counts the files resolved so far for one recipe (shared down the recursion)."""
    parents_cfg, prov, data = load_parents(path, seen, loads)
    return merge(parents_cfg, prov, data, leaf_sources(data, str(path.resolve())))


def load_parents(
    path: Path, seen: tuple[Path, ...] = (), loads: list[int] | None = None
) -> tuple[dict, Provenance, dict]:
    """Merge of the parents of `path` only, with the file's own keys (minus `defaults`) returned too."""
    path = path.resolve()
    loads = [0] if loads is None else loads
    count_load(path, seen, loads)
    data = read_yaml(path)
    parents = parent_list(data.pop("defaults", None), path)
    merged: dict = {}
    prov: Provenance = {}
    for parent in parents:
        pdata, pprov = load_chain(resolve_parent(parent, path), (*seen, path), loads)
        merged, prov = merge(merged, prov, pdata, pprov)
    return merged, prov, data


def count_load(path: Path, seen: tuple[Path, ...], loads: list[int]) -> None:
    """Count one more file of a `defaults:` expansion (`loads`, shared by every file of one
    recipe) and refuse the expansion past `MAX_PARENT_LOADS` files in all, a cycle (`path`
    already in `seen`, the files above it), or a chain deeper than `MAX_CHAIN_DEPTH`."""
    loads[0] += 1
    if loads[0] > MAX_PARENT_LOADS:
        top = seen[0] if seen else path
        issue = Problem(
            "defaults",
            f"defaults resolve more than {MAX_PARENT_LOADS} parent files in all (from "
            f"{top.name}; a file listed repeatedly is resolved each time)",
            "list each parent once; a recipe has a few parents",
            str(path),
        )
        raise RecipeError(str(top), [issue])
    if path in seen:
        chain = " -> ".join(p.name for p in (*seen, path))
        raise RecipeError(
            str(path),
            [
                Problem(
                    "defaults", f"cycle in defaults chain: {chain}", "remove the cycle", str(path)
                )
            ],
        )
    if len(seen) >= MAX_CHAIN_DEPTH:
        issue = Problem(
            "defaults",
            f"defaults chain deeper than {MAX_CHAIN_DEPTH} files (from {seen[0].name})",
            "point the recipe at configs/ parents directly; a chain is a few files deep",
            str(path),
        )
        raise RecipeError(str(seen[0]), [issue])


def parent_list(parents: Any, path: Path) -> list[str]:
    """`defaults:` as a list of paths: one string, a list of strings, or nothing."""
    if parents is None:
        return []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        issue = Problem(
            "defaults",
            f"expected a path or a list of paths, got {parents!r}",
            "write `defaults: ../../configs/base/grpo.yaml` (or a name such as "
            "tiny/grpo-tiny-qwen3-cpu-bf16), or a list of them",
            str(path),
        )
        raise RecipeError(str(path), [issue])
    return parents


def apply_overrides(config: dict, overrides: list[str], prov: Provenance) -> list[Problem]:
    """Apply `dotted.key=value` and `~dotted.key[=value]` overrides in order (values parsed as
    YAML); returns the malformed or impossible ones as issues."""
    issues = []
    for item in overrides:
        if item.startswith("~"):
            issue = _delete(config, item, prov)
            if issue is not None:
                issues.append(issue)
            continue
        key, sep, raw = item.partition("=")
        key = key.strip()
        prefix = key[: len(key) - len(key.lstrip("+"))]
        if len(prefix) > 2:  # Hydra knows +key and ++key only: +++key is no override of its
            issues.append(_bad_prefix(item, prefix))
            continue
        adds = prefix == "+"
        key = key.lstrip("+")
        if not sep or not _well_formed(key):
            issues.append(_malformed(item))
            continue
        if adds and _present(config, key):
            issues.append(_already_set(item, key))
            continue
        value = parse_yaml(raw, f"override {shown(item)}") if raw.strip() else None
        if isinstance(value, str) and "\n" in raw.strip() and "\n" not in value:
            issues.append(_folded(key, value))
            continue
        node = config
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
        _forget(prov, key)
        prov.update(leaf_sources(value, "override", f"{key}."))
    return issues


def _present(config: dict, key: str) -> bool:
    """True when the dotted `key` is set in `config` (to any value, null included)."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _already_set(item: str, key: str) -> Problem:
    """`+key=value` adds a key (Hydra's append); on a key the recipe has, it is refused."""
    return Problem(
        shown(item),
        f"+ adds a key, but {key} is already set",
        f"write {key}=<value> (or ++{key}=<value>, add or override) to change it",
        "override",
    )


def _folded(key: str, value: str) -> Problem:
    """A line break in an override's value, which YAML would silently fold into a space."""
    return Problem(
        key,
        f"value holds a line break, which YAML folds into a space ({value!r})",
        'write the value on one line (a quoted "\\n" keeps a newline where one is allowed)',
        "override",
    )


def _well_formed(key: str) -> bool:
    return bool(key) and all(part for part in key.split("."))


def _bad_prefix(item: str, prefix: str) -> Problem:
    return Problem(
        shown(item),
        f"{prefix!r} is not an override prefix (Hydra's are + to add a key and ++ to add or set)",
        "write +key=value, ++key=value or key=value",
        "override",
    )


def _malformed(item: str) -> Problem:
    return Problem(
        item,
        "malformed override",
        "write dotted.key=value to set a key (e.g. grpo.max_num_steps=10) or ~dotted.key to "
        "delete one",
        "override",
    )


def _forget(prov: Provenance, key: str) -> None:
    for stale in [k for k in prov if k == key or k.startswith(key + ".")]:
        del prov[stale]


def _delete(config: dict, item: str, prov: Provenance) -> Problem | None:
    """`~a.b` deletes `a.b`; `~a.b=v` only when its value is `v` (Hydra's delete override)."""
    key, sep, raw = item[1:].partition("=")
    key = key.strip()
    if not _well_formed(key):
        return _malformed(item)
    *parents, leaf = key.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        return Problem(
            item,
            f"no key {key} to delete",
            "check the key path (nemo_fp8_rl.recipes show R prints every key)",
            "override",
        )
    if sep:
        expected = parse_yaml(raw, f"override {shown(item)}") if raw.strip() else None
        if node[leaf] != expected:
            return Problem(
                item,
                f"the value of {key} is {node[leaf]!r}, not {expected!r}",
                f"write ~{key} to delete it whatever its value",
                "override",
            )
    del node[leaf]
    _forget(prov, key)
    return None
