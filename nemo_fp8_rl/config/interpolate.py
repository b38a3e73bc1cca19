"""Resolve OmegaConf-style interpolations the way NeMo RL's configs use them.

`${a.b}` refers to another key (absolute), `${.x}` to a sibling in the same section, and the
resolvers NeMo RL registers (`add`, `mul`, `div`, `max`) combine values: `${mul:${a}, 2}`.
A string that is exactly one interpolation takes the referenced value's type.

Bounded: resolvers take numbers only (so `${mul:abc,300000000}` cannot build a huge string), a
result must be a finite number below 2**63 in magnitude, a string at most `MAX_STRING` characters,
a reference chain at most `MAX_CHAIN` links; each key is resolved once (memoised), so time is
linear in the config. Division by zero and the like are errors at the key that asked for them.
"""

from __future__ import annotations

import math
import operator
import re
from functools import reduce
from typing import Any

from nemo_fp8_rl.config.errors import ConfigIssue, RecipeError
from nemo_fp8_rl.config.safe_yaml import parse_yaml

_INNER = re.compile(r"\$\{([^${}]*)\}")
_RESOLVERS = {
    "add": lambda *a: reduce(operator.add, a),
    "mul": lambda *a: reduce(operator.mul, a),
    "div": lambda a, b: a / b,
    "max": lambda *a: max(a),
}
_MISSING = object()
MAX_STRING = 65_536
MAX_CHAIN = 32
MAX_INT = 2**63


class InterpolationError(Exception):
    """A reference that cannot be resolved (missing key, cycle, unknown resolver); with a fix."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.fix = fix


def resolve_all(config: dict) -> tuple[dict, list[ConfigIssue]]:
    """Return a copy of `config` with every interpolation resolved, plus issues for those that fail."""
    issues: list[ConfigIssue] = []
    out = _walk(config, _Context(config), "", issues)
    return out, issues


class _Context:
    """The config being resolved and the keys already resolved (each is resolved once)."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.memo: dict[str, Any] = {}


def _walk(node: Any, ctx: _Context, path: str, issues: list[ConfigIssue]) -> Any:
    if isinstance(node, dict):
        return {
            k: _walk(v, ctx, f"{path}.{k}" if path else str(k), issues) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_walk(v, ctx, f"{path}[{i}]", issues) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        try:
            return _resolve_key(node, ctx, path, ())
        except InterpolationError as exc:
            issues.append(
                ConfigIssue(
                    path,
                    f"cannot resolve {_short(node)}: {exc}",
                    exc.fix,
                )
            )
            return node
    return node


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _resolve_key(text: str, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    """The resolved value of the string `text` stored at `path` (memoised per key)."""
    if path in ctx.memo:
        return ctx.memo[path]
    if len(stack) >= MAX_CHAIN:
        raise InterpolationError(
            f"reference chain longer than {MAX_CHAIN} keys", "refer to the value more directly"
        )
    value = _resolve_string(text, ctx, path, (*stack, path))
    ctx.memo[path] = value
    return value


def _resolve_string(text: str, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    while True:
        match = _INNER.search(text)
        if match is None:
            return text
        value = _evaluate(match.group(1).strip(), ctx, path, stack)
        if match.span() == (0, len(text)):
            return value
        text = text[: match.start()] + str(value) + text[match.end() :]
        if len(text) > MAX_STRING:
            raise InterpolationError(
                f"the result grows past {MAX_STRING:,} characters",
                "interpolate short values only",
            )


def _number(text: str, name: str) -> int | float:
    try:
        value = parse_yaml(text.strip()) if text.strip() else None
    except RecipeError:
        value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InterpolationError(
            f"{name} takes numbers, got {_short(text.strip())}",
            f"pass numbers (or references to numbers) to ${{{name}:...}}",
        )
    return value


def _apply(name: str, args: str) -> int | float:
    """A resolver on numeric arguments; the result must be a finite number below 2**63."""
    values = [_number(a, name) for a in args.split(",")]
    try:
        result = _RESOLVERS[name](*values)
    except ZeroDivisionError as exc:
        raise InterpolationError(
            f"division by zero in ${{{name}:{args}}}", "make the divisor non-zero"
        ) from exc
    except (TypeError, OverflowError) as exc:
        raise InterpolationError(
            f"${{{name}:{args}}}: {exc}", f"check the arguments of {name}"
        ) from exc
    if (isinstance(result, float) and not math.isfinite(result)) or abs(result) >= MAX_INT:
        raise InterpolationError(
            f"${{{name}:{args}}} is out of range ({result:.3g})", "use smaller numbers"
        )
    return result


def _evaluate(expr: str, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    name, colon, args = expr.partition(":")
    if colon and name in _RESOLVERS:
        return _apply(name, args)
    if colon:
        raise InterpolationError(
            f"unknown resolver {name!r}", f"use one of: {', '.join(_RESOLVERS)}"
        )
    target = _absolute(expr, path)
    if target in stack:
        raise InterpolationError(
            f"reference cycle through {target}", "break the cycle with a plain value"
        )
    value = lookup(ctx.root, target)
    if value is _MISSING:
        raise InterpolationError(f"no key {target}", "point the reference at an existing key")
    if isinstance(value, str) and "${" in value:
        return _resolve_key(value, ctx, target, stack)
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
