"""The policy-config keys a NeMo RL source file reads with `[]`, found by reading its syntax tree.

For code that cannot run on CPU (the Megatron worker's `nemo_rl/models/megatron/setup.py` needs
Megatron-Bridge, hence Transformer Engine and CUDA), the preflight falls back to this: within each
function, names bound to the policy config (`config`, `policy_cfg`, `policy_config`, `cfg`,
`self.cfg`) and names assigned from a constant-key subscript chain of them
(`megatron_cfg = config["megatron_cfg"]`, also through `dict(...)` / `copy.deepcopy(...)`) are
followed, and every `name["a"]["b"]` read gives the dotted key `policy.<...>.a.b` with its line.
`.get()` reads are not reported (they have a fallback), nor reads whose key or parent key the
same function tests with `"key" in ...` (guarded). It is flow-insensitive: a read inside a
branch the recipe never takes is still listed, so these are candidates, checked against the
hand-off, not proof that the key is needed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

POLICY_NAMES = ("config", "policy_cfg", "policy_config", "cfg", "self.cfg")
COPIES = ("dict", "copy.deepcopy", "deepcopy", "copy.copy")


@dataclass(frozen=True)
class ConfigRead:
    """A `[]` read of a policy-config key: dotted key, file (relative to the tree) and line."""

    key: str
    file: str
    line: int


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _chain(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`x["a"]["b"]` with `x` an alias -> its dotted key; None for anything else."""
    if isinstance(node, ast.Subscript):
        if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            return None
        base = _chain(node.value, aliases)
        return f"{base}.{node.slice.value}" if base else None
    if isinstance(node, ast.Call) and _dotted_name(node.func) in COPIES and node.args:
        return _chain(node.args[0], aliases)
    name = _dotted_name(node)
    return aliases.get(name) if name else None


def _presence_checked(fn: ast.AST) -> set[str]:
    """Keys the function tests with `"key" in ...` (its `[]` reads of them are guarded)."""
    return {
        node.left.value
        for node in ast.walk(fn)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
        and any(isinstance(op, ast.In) for op in node.ops)
    }


def _function_reads(fn: ast.AST, file: str) -> list[ConfigRead]:
    aliases = {name: "policy" for name in POLICY_NAMES}
    guarded = _presence_checked(fn)
    events: list[tuple[int, int, ast.AST]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign | ast.Subscript):
            events.append((node.lineno, node.col_offset, node))
    reads = []
    for _, _, node in sorted(events, key=lambda e: (e[0], e[1])):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                name = _dotted_name(target)
                if name:
                    path = _chain(node.value, aliases)
                    if path:
                        aliases[name] = path
                    else:
                        aliases.pop(name, None)
        elif isinstance(node.ctx, ast.Load):
            path = _chain(node, aliases)
            if path and path != "policy" and not guarded & set(path.split(".")[-2:]):
                reads.append(ConfigRead(path, file, node.lineno))
    return reads


def bracket_reads(tree_root: Path, relative: str) -> list[ConfigRead]:
    """Every `[]` read of a policy-config key in `tree_root/relative`, by function."""
    source = (tree_root / relative).read_text()
    module = ast.parse(source)
    reads: list[ConfigRead] = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            reads += _function_reads(node, relative)
    unique = {(r.key, r.line): r for r in reads}
    return sorted(unique.values(), key=lambda r: r.line)
