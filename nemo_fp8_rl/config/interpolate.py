"""Resolve OmegaConf-style interpolations the way NeMo RL's configs use them.

`${a.b}` refers to another key (absolute), `${.x}` to a sibling in the same section, and the
resolvers NeMo RL registers (`add`, `mul`, `div`, `max`) combine values: `${mul:${a}, 2}`.
A string that is exactly one interpolation takes the referenced value's type.
"""

from __future__ import annotations

import operator
import re
from functools import reduce
from typing import Any

import yaml

from nemo_fp8_rl.config.errors import ConfigIssue

_INNER = re.compile(r"\$\{([^${}]*)\}")
_RESOLVERS = {
    "add": lambda *a: reduce(operator.add, a),
    "mul": lambda *a: reduce(operator.mul, a),
    "div": lambda a, b: a / b,
    "max": lambda *a: max(a),
}
_MISSING = object()


class InterpolationError(Exception):
    """A reference that cannot be resolved (missing key, cycle, unknown resolver)."""


def resolve_all(config: dict) -> tuple[dict, list[ConfigIssue]]:
    """Return a copy of `config` with every interpolation resolved, plus issues for those that fail."""
    issues: list[ConfigIssue] = []
    out = _walk(config, config, "", issues, ())
    return out, issues


def _walk(
    node: Any, root: dict, path: str, issues: list[ConfigIssue], stack: tuple[str, ...]
) -> Any:
    if isinstance(node, dict):
        return {
            k: _walk(v, root, f"{path}.{k}" if path else str(k), issues, stack)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_walk(v, root, f"{path}[{i}]", issues, stack) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        try:
            return _resolve_string(node, root, path, (*stack, path))
        except InterpolationError as exc:
            issues.append(
                ConfigIssue(
                    path,
                    f"cannot resolve {node!r}: {exc}",
                    "point the reference at an existing key",
                )
            )
            return node
    return node


def _resolve_string(text: str, root: dict, path: str, stack: tuple[str, ...]) -> Any:
    while True:
        match = _INNER.search(text)
        if match is None:
            return text
        value = _evaluate(match.group(1).strip(), root, path, stack)
        if match.span() == (0, len(text)):
            return value
        text = text[: match.start()] + str(value) + text[match.end() :]


def _evaluate(expr: str, root: dict, path: str, stack: tuple[str, ...]) -> Any:
    name, colon, args = expr.partition(":")
    if colon and name in _RESOLVERS:
        values = [yaml.safe_load(a.strip()) for a in args.split(",")]
        return _RESOLVERS[name](*values)
    if colon:
        raise InterpolationError(f"unknown resolver {name!r} (known: {', '.join(_RESOLVERS)})")
    target = _absolute(expr, path)
    if target in stack:
        raise InterpolationError(f"reference cycle through {target}")
    value = lookup(root, target)
    if value is _MISSING:
        raise InterpolationError(f"no key {target}")
    if isinstance(value, str) and "${" in value:
        return _resolve_string(value, root, target, (*stack, target))
    return value


def _absolute(ref: str, path: str) -> str:
    """`.x` is relative to the section holding `path`; anything else is absolute."""
    if not ref.startswith("."):
        return ref
    section = path.rsplit(".", 1)[0] if "." in path else ""
    return f"{section}.{ref[1:]}" if section else ref[1:]


def lookup(root: dict, dotted: str) -> Any:
    """Value at a dotted path, or a private sentinel when absent."""
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def is_missing(value: Any) -> bool:
    """True for the sentinel `lookup` returns for an absent key."""
    return value is _MISSING
