"""Load a recipe: the `defaults:` chain with NeMo RL's semantics, overrides, provenance, interpolation.

Semantics (as `nemo_rl.utils.config.load_config_with_inheritance`):
- `defaults:` is a path or a list of paths, relative to the file that names them; parents are
  resolved depth-first and merged left to right, then the file's own keys last;
- dicts merge key by key; lists and scalars replace; a dict with `_override_: true` replaces the
  inherited dict instead of merging into it;
- `${a.b}` (absolute), `${.x}` (relative to the enclosing section) and the resolvers `add`, `mul`,
  `div`, `max` (`${mul:${a}, 2}`) are resolved after the merge.
Every leaf key remembers the file (or "override") that last set it.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.errors import ConfigIssue, RecipeError

Provenance = dict[str, str]


class _Loader(yaml.SafeLoader):
    """YAML 1.2-style floats: `1e-6` and `5.0e-7` load as floats, not strings (PyYAML is YAML 1.1)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str = "<string>") -> Any:
    """Parse YAML text with the project's loader; a syntax error names the file and line."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise RecipeError(
            where, [ConfigIssue("<file>", f"invalid YAML: {exc}", "fix the syntax", where)]
        ) from exc


def read_yaml(path: Path) -> dict:
    """Read one YAML mapping file (parsed once per file version, returned as a fresh copy)."""
    if not path.is_file():
        raise RecipeError(
            str(path), [ConfigIssue("<file>", "file not found", "check the path", str(path))]
        )
    stat = path.stat()
    return copy.deepcopy(_read_cached(str(path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=256)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict:
    data = parse_yaml(Path(path).read_text(), path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(
            path,
            [ConfigIssue("<file>", "top level is not a mapping", "write `key: value` lines", path)],
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
    for key, value in update.items():
        path = f"{prefix}{key}"
        replace = isinstance(value, dict) and value.get("_override_") is True
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not replace:
            _merge_into(out[key], prov, value, update_prov, f"{path}.")
            continue
        if replace:
            value = {k: v for k, v in value.items() if k != "_override_"}
        for stale in [k for k in prov if k == path or k.startswith(path + ".")]:
            del prov[stale]
        out[key] = copy.deepcopy(value)
        prov.update({k: v for k, v in update_prov.items() if k == path or k.startswith(path + ".")})


def load_chain(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, Provenance]:
    """Resolve `path` with its `defaults:` chain (depth-first, parents left to right, file last)."""
    parents_cfg, prov, data = load_parents(path, seen)
    return merge(parents_cfg, prov, data, leaf_sources(data, str(path.resolve())))


def load_parents(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, Provenance, dict]:
    """Merge of the parents of `path` only, with the file's own keys (minus `defaults`) returned too."""
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(p.name for p in (*seen, path))
        raise RecipeError(
            str(path),
            [
                ConfigIssue(
                    "defaults", f"cycle in defaults chain: {chain}", "remove the cycle", str(path)
                )
            ],
        )
    data = read_yaml(path)
    parents = data.pop("defaults", None) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict = {}
    prov: Provenance = {}
    for parent in parents:
        parent_path = Path(parent) if Path(parent).is_absolute() else path.parent / parent
        if not parent_path.is_file():
            issue = ConfigIssue(
                "defaults",
                f"parent {parent!r} not found (looked at {parent_path})",
                "fix the path; it is relative to this file",
                str(path),
            )
            raise RecipeError(str(path), [issue])
        pdata, pprov = load_chain(parent_path, (*seen, path))
        merged, prov = merge(merged, prov, pdata, pprov)
    return merged, prov, data


def apply_overrides(config: dict, overrides: list[str], prov: Provenance) -> list[ConfigIssue]:
    """Apply `dotted.key=value` overrides (values parsed as YAML); returns malformed ones as issues."""
    issues = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("+")
        if not sep or not key or any(not part for part in key.split(".")):
            issues.append(
                ConfigIssue(
                    item,
                    "malformed override",
                    "write dotted.key=value, e.g. grpo.max_num_steps=10",
                    "override",
                )
            )
            continue
        value = parse_yaml(raw, f"override {item}") if raw.strip() else None
        node = config
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
        for stale in [k for k in prov if k == key or k.startswith(key + ".")]:
            del prov[stale]
        prov.update(leaf_sources(value, "override", f"{key}."))
    return issues
