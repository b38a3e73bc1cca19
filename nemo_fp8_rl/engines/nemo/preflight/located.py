"""Located errors: an exception raised inside NeMo RL, turned into key path + NeMo RL file:line + fix.

The location comes from the real traceback, not from a table: the innermost frame whose file is
part of NeMo RL (`/nemo_rl/` in its path) is where NeMo RL needed something. For a `KeyError` the
container is found by evaluating the subscripted expression of the failing instruction in that
frame (Python >= 3.11 records each instruction's column span: `data_config["x"]` gives
`data_config`), then looking the object up among the hand-off's dicts by identity (or, for a copy
NeMo RL made, by equality). The key path is the container's path plus the missing key.

Needs nothing of NeMo RL, so the reporting is tested on any machine.
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

PACKAGE_MARK = "/nemo_rl/"


@dataclass(frozen=True)
class LocatedError:
    """One problem: where in the config, where in NeMo RL, what went wrong and how to fix it."""

    key: str | None  # dotted key path in the hand-off (None: not a missing key)
    file: str  # NeMo RL file relative to its tree, e.g. nemo_rl/algorithms/grpo.py
    line: int
    message: str
    fix: str

    def render(self) -> str:
        where = f"{self.file}:{self.line}"
        head = f"{self.key}: {self.message}" if self.key else self.message
        return f"  - {head}\n      needed at {where}\n      fix: {self.fix}"


def tree_paths(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, node) for every dict and list inside `tree`, `tree` itself first.

    A list's items take the list's path (NeMo RL turns `data.train` into a one-item list).
    """
    yield prefix, tree
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        if isinstance(value, dict | list):
            child = prefix if isinstance(tree, list) else (f"{prefix}.{key}" if prefix else key)
            yield from tree_paths(value, str(child))


def nemo_rl_frame(tb: TracebackType | None) -> tuple[FrameType, int, TracebackType] | None:
    """The innermost traceback entry inside NeMo RL: (frame, line, entry), or None."""
    found = None
    while tb is not None:
        if PACKAGE_MARK in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            found = (tb.tb_frame, tb.tb_lineno, tb)
        tb = tb.tb_next
    return found


def innermost_in(exc: BaseException, package: str) -> tuple[str, int]:
    """(file from `package` on, line) of the innermost traceback entry under `/<package>/`.

    Where a library's own validation refused (`megatron/core`, `vllm`); `(package, 0)` when no
    entry lies under it.
    """
    tb, where, mark = exc.__traceback__, (package, 0), f"/{package}/"
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if mark in path:
            where = (path[path.rfind(mark) + 1 :], tb.tb_lineno)
        tb = tb.tb_next
    return where


def relative_file(path: str) -> str:
    """`/x/y/nemo-rl/nemo_rl/a/b.py` -> `nemo_rl/a/b.py`."""
    norm = path.replace("\\", "/")
    cut = norm.rfind(PACKAGE_MARK)
    return norm[cut + 1 :] if cut >= 0 else norm


def _failing_expression(tb: TracebackType) -> str | None:
    """Source text of the instruction that raised (Python >= 3.11 column positions)."""
    code = tb.tb_frame.f_code
    positions = list(code.co_positions())
    index = tb.tb_lasti // 2
    if index >= len(positions):
        return None
    start, end, col, end_col = positions[index]
    if None in (start, end, col, end_col):
        return None
    lines = [
        linecache.getline(code.co_filename, n, tb.tb_frame.f_globals) for n in range(start, end + 1)
    ]
    if len(lines) == 1:
        return lines[0][col:end_col]
    return "".join([lines[0][col:], *lines[1:-1], lines[-1][:end_col]])


def _is_plain_lookup(node: ast.AST) -> bool:
    """Names, attributes and constant subscripts only: safe to evaluate again."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _is_plain_lookup(node.value)
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and _is_plain_lookup(node.value)
    return False


def container_of_failure(tb: TracebackType) -> Any | None:
    """The object a failing `obj[key]` subscripted, re-evaluated in the failing frame."""
    text = _failing_expression(tb)
    if not text:
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Subscript) or not _is_plain_lookup(node.value):
        return None
    frame = tb.tb_frame
    try:
        return eval(  # noqa: S307 - names/attributes/constant subscripts only (checked above)
            compile(ast.Expression(node.value), "<located>", "eval"),
            frame.f_globals,
            frame.f_locals,
        )
    except Exception:
        return None


def key_path_of(container: Any, key: Any, roots: dict[str, Any]) -> str | None:
    """Dotted path of `container[key]` among the trees in `roots` (identity, then equality)."""
    if container is None:
        return None
    candidates = [
        (f"{name}.{p}" if p else name, node)
        for name, tree in roots.items()
        for p, node in tree_paths(tree)
    ]
    for path, node in candidates:
        if node is container:
            return f"{path}.{key}"
    for path, node in candidates:
        if isinstance(node, dict) and node == container:
            return f"{path}.{key}"
    return None


def locate(exc: BaseException, roots: dict[str, Any]) -> LocatedError | None:
    """`exc` as a LocatedError at its innermost NeMo RL frame; None if NeMo RL is not on the stack.

    `roots` maps a section name (`policy`, `data`, ...) to the live config dict NeMo RL reads.
    """
    hit = nemo_rl_frame(exc.__traceback__)
    if hit is None:
        return None
    frame, line, tb = hit
    file = relative_file(frame.f_code.co_filename)
    if isinstance(exc, KeyError) and exc.args:
        key = exc.args[0]
        path = key_path_of(container_of_failure(tb), key, roots)
        return LocatedError(
            key=path or f"?.{key}",
            file=file,
            line=line,
            message="missing: NeMo RL reads it with [] (KeyError)",
            fix=f"add `{path or key}` to the recipe or configs/base/grpo.yaml",
        )
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    source = linecache.getline(frame.f_code.co_filename, line).strip()
    if own_bug(exc, tb):
        return _own_bug(exc, text, frame, line, file, roots)
    key = statement_key(frame, line, roots)
    return LocatedError(
        key=key,
        file=file,
        line=line,
        message=f"{type(exc).__name__}: {text}"[:400],
        fix=(f"set `{key}` so that " if key else "change the recipe so that ")
        + f"NeMo RL's `{source[:120]}` holds",
    )


# Errors of the code itself (a call with the wrong arguments, a missing attribute or name) raised
# by NeMo RL's own statement: NeMo RL's bug, whatever the config, not the recipe's.
OWN_BUG_TYPES = (TypeError, AttributeError, NameError)


def own_bug(exc: BaseException, tb: TracebackType) -> bool:
    """Whether `exc` is NeMo RL's own bug: raised in NeMo RL's frame `tb` itself (not deeper in
    another library), a call with the wrong arguments (`list.append(a, b, c)`), a missing name,
    or a missing attribute of something other than None (None: a key the recipe left null)."""
    if tb.tb_next is not None or not isinstance(exc, OWN_BUG_TYPES):
        return False
    if isinstance(exc, AttributeError):  # None.x: a key the recipe set to null
        return "NoneType" not in str(exc)
    return isinstance(exc, NameError) or "argument" in str(exc)


def _words(name: str) -> set[str]:
    return {w for w in name.lower().replace(".", "_").split("_") if len(w) > 2}


def branch_key(frame: FrameType, line: int, roots: dict[str, Any]) -> str | None:
    """The config key most likely to have led NeMo RL to `line`: of the names tested by the `if`
    statements around it (`if cfg.use_activation_pow2_scale:`), the true leaf of `roots` sharing
    the most words (at least two) with one of them (`pow2_activation_scaling_factors`)."""
    try:
        tree = ast.parse("".join(linecache.getlines(frame.f_code.co_filename)))
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno < line <= (node.end_lineno or 0):
            names |= {
                n.attr if isinstance(n, ast.Attribute) else n.id
                for n in ast.walk(node.test)
                if isinstance(n, ast.Attribute | ast.Name)
            }
    best, score = None, 1
    for root, tree_ in roots.items():
        for path, node in tree_paths(tree_, root):
            if not isinstance(node, dict):
                continue
            for key, value in node.items():
                if value is True:
                    shared = max((len(_words(str(key)) & _words(n)) for n in names), default=0)
                    if shared > score:
                        best, score = f"{path}.{key}", shared
    return best


def _own_bug(
    exc: BaseException, text: str, frame: FrameType, line: int, file: str, roots: dict[str, Any]
) -> LocatedError:
    """NeMo RL's own bug at `file:line`, with the key that led there when one is found."""
    key = branch_key(frame, line, roots)
    reached = f", reached with `{key}: true`" if key else ""
    return LocatedError(
        key=key,
        file=file,
        line=line,
        message=f"NeMo RL's own bug, not the recipe's ({type(exc).__name__}: {text}){reached}"[
            :400
        ],
        fix=(
            "use a NeMo RL tree where this line is fixed (e.g. a newer NeMo RL)"
            + (f", or set `{key}: false` if the run can do without it" if key else "")
        ),
    )


def _failing_statement(frame: FrameType, line: int) -> ast.stmt | None:
    """The smallest simple statement of the frame's file that spans `line`."""
    try:
        tree = ast.parse("".join(linecache.getlines(frame.f_code.co_filename)))
    except SyntaxError:
        return None
    compound = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While)
    spans = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt)
        and not isinstance(n, compound + (ast.With, ast.Try))
        and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    return min(spans, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


def statement_key(frame: FrameType, line: int, roots: dict[str, Any]) -> str | None:
    """Key path of the first config read `obj["k"]` in the failing statement (None if none).

    Each constant subscript whose container is a plain lookup is evaluated again in the failing
    frame and the container looked up among `roots`, as for a KeyError.
    """
    stmt = _failing_statement(frame, line)
    if stmt is None or not roots:
        return None
    for node in ast.walk(stmt):
        if not (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and _is_plain_lookup(node.value)
        ):
            continue
        try:
            container = eval(  # noqa: S307 - names/attributes/constant subscripts only
                compile(ast.Expression(node.value), "<located>", "eval"),
                frame.f_globals,
                frame.f_locals,
            )
        except Exception:
            continue
        path = key_path_of(container, node.slice.value, roots)
        if path:
            return path
    return None


def with_default_fix(error: LocatedError, value: Any, source: str | None) -> LocatedError:
    """The same error with NeMo RL's own value for the key as the fix."""
    if source is None:
        return error
    fix = f"add `{error.key}: {value!r}` (NeMo RL's value in {source}) to configs/base/grpo.yaml"
    return LocatedError(error.key, error.file, error.line, error.message, fix)


def render_report(recipe: str, errors: list[LocatedError], tree: Path | None = None) -> str:
    """All problems of one recipe, one block each."""
    where = f" against NeMo RL at {tree}" if tree else ""
    head = f"preflight of {recipe}{where}: {len(errors)} problem(s)"
    return "\n".join([head, *(e.render() for e in errors)])
