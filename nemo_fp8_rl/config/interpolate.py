"""Resolve OmegaConf-style interpolations the way NeMo RL's configs use them.

`${a.b}` refers to another key (absolute), `${.x}` to a sibling in the same section, and the
resolvers NeMo RL registers (`add`, `mul`, `div`, `max`) combine values: `${mul:${a}, 2}`.
Importing a NeMo RL config also reads `${oc.env:VAR[,default]}` as OmegaConf does (`env=True`).
A string is parsed once with OmegaConf's grammar (`interp_parse`): what an interpolation returns
(an environment variable holding `${x}`, say) is never parsed again, `\\${` is a literal `${`,
and a string that is exactly one interpolation takes the referenced value's type.
`escape_literals` writes a resolved config back so that it loads as the same values.

Bounded: resolvers take numbers only (so `${mul:abc,300000000}` cannot build a huge string), a
result must be a finite number below 2**63 in magnitude, a string at most `MAX_STRING` characters,
a reference chain at most `MAX_CHAIN` links; each key is resolved once (memoised), so time is
linear in the config. Division by zero and the like are errors at the key that asked for them.
"""

from __future__ import annotations

import math
import operator
import os
from functools import reduce
from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.interp_parse import (
    Arg,
    Call,
    ParseError,
    Part,
    Ref,
    encode_literal,
    parse,
    primitive,
)

_RESOLVERS = {
    "add": lambda *a: reduce(operator.add, a),
    "mul": lambda *a: reduce(operator.mul, a),
    "div": lambda a, b: a / b,
    "max": lambda *a: max(a),
}
ENV_RESOLVER = "oc.env"
_MISSING = object()
MAX_STRING = 65_536
MAX_CHAIN = 32
MAX_INT = 2**63


class InterpolationError(Exception):
    """A reference that cannot be resolved (missing key, cycle, unknown resolver); with a fix.
    `plain`: the message is the whole problem (not prefixed with the string that failed)."""

    def __init__(self, problem: str, fix: str, plain: bool = False) -> None:
        super().__init__(problem)
        self.fix = fix
        self.plain = plain


def resolve_all(config: dict, env: bool = False) -> tuple[dict, list[Problem]]:
    """Return a copy of `config` with every interpolation resolved, plus issues for those that
    fail; with `env`, `${oc.env:...}` reads the environment (a NeMo RL config's import)."""
    issues: list[Problem] = []
    out = _walk(config, _Context(config, env), "", issues)
    return out, issues


def escape_literals(node: Any) -> Any:
    """A copy of a resolved config whose strings read back as themselves: every literal `${`
    escaped (`interp_parse.encode_literal`), so that saving and loading it again changes
    nothing (a value from the environment that holds `${x}` stays `${x}`)."""
    if isinstance(node, dict):
        return {k: escape_literals(v) for k, v in node.items()}
    if isinstance(node, list):
        return [escape_literals(v) for v in node]
    if isinstance(node, str) and "${" in node:
        return encode_literal(node)
    return node


class _Context:
    """The config being resolved and the keys already resolved (each is resolved once)."""

    def __init__(self, root: dict, env: bool = False) -> None:
        self.root = root
        self.env = env
        self.memo: dict[str, Any] = {}


def _walk(node: Any, ctx: _Context, path: str, issues: list[Problem]) -> Any:
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
            problem = str(exc) if exc.plain else f"cannot resolve {_short(node)}: {exc}"
            issues.append(Problem(path, problem, exc.fix))
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
    """One interpolation alone: its value; else the text with each interpolation's value
    (as `str`) in its place, never parsed again."""
    try:
        parts = parse(text)
    except ParseError as exc:
        raise InterpolationError(
            f"not a valid interpolation ({exc})",
            "close every ${ with }, or write \\${ for a literal ${",
        ) from exc
    if len(parts) == 1 and not isinstance(parts[0], str):
        return _value(parts[0], ctx, path, stack)
    return _concat(parts, ctx, path, stack)


def _concat(parts: tuple[Part, ...], ctx: _Context, path: str, stack: tuple[str, ...]) -> str:
    out: list[str] = []
    size = 0
    for part in parts:
        piece = part if isinstance(part, str) else str(_value(part, ctx, path, stack))
        size += len(piece)
        if size > MAX_STRING:
            raise InterpolationError(
                f"the result grows past {MAX_STRING:,} characters",
                "interpolate short values only",
            )
        out.append(piece)
    return "".join(out)


def _value(part: Part, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    """The value of one interpolation."""
    if isinstance(part, Ref):
        return _reference(part.key, ctx, path, stack)
    assert isinstance(part, Call)
    args = [_argument(a, ctx, path, stack) for a in part.args]
    if part.name == ENV_RESOLVER and ctx.env:
        return _env(args, path)
    if part.name in _RESOLVERS:
        return _apply(part.name, args)
    also = " (${oc.env:...} is read when a NeMo RL config is imported)"
    raise InterpolationError(
        f"unknown resolver {part.name!r}",
        f"use one of: {', '.join(_RESOLVERS)}" + ("" if ctx.env else also),
    )


def _argument(arg: Arg, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    """A resolver argument: quoted, text; one interpolation alone, its value; plain text, a
    primitive (`interp_parse.primitive`); text mixed with interpolations, text."""
    if not arg.quoted and len(arg.parts) == 1 and not isinstance(arg.parts[0], str):
        return _value(arg.parts[0], ctx, path, stack)
    if not arg.quoted and all(isinstance(p, str) for p in arg.parts):
        return primitive("".join(arg.parts))  # type: ignore[arg-type]
    return _concat(arg.parts, ctx, path, stack)


def _env(args: list[Any], path: str) -> str | None:
    """OmegaConf's `oc.env`: the variable's value as set (never parsed again); unset, the
    default (`str(default)`, or None for null); unset without a default, an error."""
    if not 1 <= len(args) <= 2 or not isinstance(args[0], str):
        raise InterpolationError(
            f"${{{ENV_RESOLVER}:...}} takes a variable name and an optional default",
            "write ${oc.env:NAME} or ${oc.env:NAME,default}",
        )
    name = args[0]
    if name in os.environ:
        return os.environ[name]
    if len(args) == 2:
        return None if args[1] is None else str(args[1])
    raise InterpolationError(
        f"needs the environment variable {name} (${{oc.env:{name}}}), which is not set",
        f"set {name}, as NeMo RL needs it too, or set {path} to a value",
        plain=True,
    )


def _number(value: Any, name: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InterpolationError(
            f"{name} takes numbers, got {_short(str(value))}",
            f"pass numbers (or references to numbers) to ${{{name}:...}}",
        )
    return value


def _apply(name: str, args: list[Any]) -> int | float:
    """A resolver on numeric arguments; the result must be a finite number below 2**63."""
    shown = ",".join(map(str, args))
    values = [_number(a, name) for a in args]
    try:
        result = _RESOLVERS[name](*values)
    except ZeroDivisionError as exc:
        raise InterpolationError(
            f"division by zero in ${{{name}:{shown}}}", "make the divisor non-zero"
        ) from exc
    except (TypeError, OverflowError) as exc:
        raise InterpolationError(
            f"${{{name}:{shown}}}: {exc}", f"check the arguments of {name}"
        ) from exc
    if (isinstance(result, float) and not math.isfinite(result)) or abs(result) >= MAX_INT:
        raise InterpolationError(
            f"${{{name}:{shown}}} is out of range ({result:.3g})", "use smaller numbers"
        )
    return result


def _reference(key: str, ctx: _Context, path: str, stack: tuple[str, ...]) -> Any:
    target = _absolute(key, path)
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
    """`.x` is relative to the section holding `path`, `..x` to the one above it (one more
    level per dot, as in OmegaConf); anything else is absolute."""
    if not ref.startswith("."):
        return ref
    rest = ref.lstrip(".")
    up = len(ref) - len(rest) - 1
    section = path.split(".")[:-1]
    if up > len(section):
        raise InterpolationError(
            f"{ref!r} goes {up} level(s) above {path!r}, past the top of the config",
            "use fewer leading dots, or an absolute key",
        )
    return ".".join([*section[: len(section) - up], *([rest] if rest else [])])


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
