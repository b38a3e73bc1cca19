"""Safe YAML for recipes: bounded in size, nesting and alias expansion; duplicate keys refused.

PyYAML alone keeps the last of two equal keys (so a repeated section silently replaces the first),
expands aliases into shared objects that every later walk visits again (a few lines of `&a`/`*a`
become billions of nodes: the "billion laughs" bomb), and recurses once per nesting level. Here a
file is refused, with its name and line, when it is not UTF-8 text, is larger than
`MAX_FILE_BYTES`, repeats a key in one mapping, has a key that is not a string (`yes:` is the
boolean True in YAML 1.1, `1:` a number; NeMo RL's configs are keyed by names), writes a whole
number longer than `numbers.MAX_INT_DIGITS` characters, nests deeper than `MAX_DEPTH`, or expands
(aliases counted as copies) to more than `MAX_NODES` nodes or more than `MAX_EXPANDED_CHARS`
characters of text (an alias of a long string is as long as the string: a few hundred KB of
aliased strings would otherwise become gigabytes once printed or copied). Floats follow YAML 1.2
(`1e-6` is a number, not a string as in YAML 1.1). Parsing uses libyaml when PyYAML has it
(linear time). `load_yaml_file` reads any YAML file the project did not write itself (a run's
saved recipe, a study's endpoints) with the same bounds.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.numbers import MAX_INT_DIGITS, too_long

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_NODES = 2_000_000
MAX_EXPANDED_CHARS = MAX_FILE_BYTES  # expanded, a file holds no more text than a file may


class _Refused(yaml.YAMLError):
    """A YAML document this loader will not build; `fix` says what to change."""

    def __init__(self, problem: str, fix: str, mark: Any = None) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(f"{problem}{where}")
        self.fix = fix


_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when installed


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    """SafeLoader with YAML 1.2 floats, duplicate-key refusal and bounded alias expansion."""

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        _check_expansion(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError as exc:
                raise ConstructorError(
                    None, None, "a mapping key must be a scalar", key_node.start_mark
                ) from exc
            if isinstance(key_node, ScalarNode) and not isinstance(key, str):
                raise _Refused(
                    f"key {key_node.value} is read as {_reading(key)}, not as a name",
                    f"quote it: '{key_node.value}': (a plain yes, no, on, off, a number or ~ "
                    "is not read as text in a key)",
                    key_node.start_mark,
                )
            if first is not None:
                raise _Refused(
                    f"duplicate key {key!r} (first set at line {first})",
                    "keep one of them; YAML would silently use the last",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        """An integer of at most MAX_INT_DIGITS characters (longer ones cannot be printed)."""
        problem = too_long(str(node.value))
        if problem is not None:
            raise _Refused(
                problem,
                f"write a number of at most {MAX_INT_DIGITS} digits (a setting, a seed or a "
                "size is a few digits)",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _reading(key: Any) -> str:
    """How YAML read a key that is not a string: `the boolean True`, `the number 1`, `null`."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return f"the boolean {key}"
    if isinstance(key, (int, float)):
        return f"the number {key}"
    return f"a {type(key).__name__} ({key})"


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


def _check_expansion(root: Node | None) -> None:
    """Refuse a node graph taller than MAX_DEPTH, expanding to more than MAX_NODES nodes or to
    more than MAX_EXPANDED_CHARS characters of scalar text.

    size(n) = 1 + sum(size(child)), chars(n) = sum(chars(child)) with chars(scalar) = its
    length, and height(n) = 1 + max(height(child)), aliases counted as full copies, computed
    once per distinct collection node (iteratively; scalars are counted in place), so time and
    memory stay linear in the file.
    """
    if root is None or isinstance(root, ScalarNode):
        return
    size: dict[int, int] = {}
    chars: dict[int, int] = {}
    height: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Node, list[Node] | None]] = [(root, None)]
    while stack:
        node, kids = stack.pop()
        key = id(node)
        if kids is not None:  # all children done
            active.discard(key)
            total, tallest, text = 1, 1, 0
            for child in kids:
                if isinstance(child, ScalarNode):
                    total += 1
                    text += len(child.value)
                else:
                    total += size[id(child)]
                    text += chars[id(child)]
                    tallest = max(tallest, height[id(child)] + 1)
            if total > MAX_NODES:
                raise _Refused(
                    f"aliases expand to more than {MAX_NODES:,} values",
                    "write the values out instead of nesting aliases",
                    node.start_mark,
                )
            if text > MAX_EXPANDED_CHARS:
                raise _Refused(
                    f"aliases expand to more than {MAX_EXPANDED_CHARS:,} characters of text",
                    "write the values out instead of repeating long strings through aliases",
                    node.start_mark,
                )
            if tallest > MAX_DEPTH:
                raise _Refused(
                    f"nested deeper than {MAX_DEPTH} levels",
                    "flatten the structure; a recipe is a few levels deep",
                    node.start_mark,
                )
            size[key], height[key], chars[key] = total, tallest, text
            continue
        if key in size:
            continue
        kids = _children(node)
        active.add(key)
        stack.append((node, kids))
        for child in kids:
            if isinstance(child, ScalarNode) or id(child) in size:
                continue
            if id(child) in active:
                raise _Refused(
                    "recursive alias", "remove the alias to its own parent", child.start_mark
                )
            stack.append((child, None))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def parse_yaml(text: str, where: str = "<string>") -> Any:
    """Parse YAML text with the project's loader; a problem names the file, line and fix."""
    try:
        return yaml.load(text, Loader=_Loader)
    except _Refused as exc:
        raise RecipeError(where, [Problem("<file>", str(exc), exc.fix, where)]) from exc
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise RecipeError(
            where, [Problem("<file>", f"invalid YAML: {problem}", "fix the syntax", where)]
        ) from exc
    except RecursionError as exc:
        raise RecipeError(
            where,
            [Problem("<file>", "nested too deeply to parse", "flatten the structure", where)],
        ) from exc


def read_text(path: Path) -> str:
    """The UTF-8 text of a recipe or config file; a folder, a huge or a binary file is refused."""
    where = str(path)
    if path.is_dir():
        raise RecipeError(
            where, [Problem("<file>", "is a folder", "give a .yaml recipe file", where)]
        )
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
            raise RecipeError(
                where,
                [Problem("<file>", "is not a regular file", "give a .yaml recipe file", where)],
            )
        size = info.st_size
        if size > MAX_FILE_BYTES:
            raise RecipeError(
                where,
                [
                    Problem(
                        "<file>",
                        f"{size:,} bytes, larger than the {MAX_FILE_BYTES:,} a recipe may have",
                        "give a recipe file (a few KB of YAML)",
                        where,
                    )
                ],
            )
        data = path.read_bytes()
    except OSError as exc:
        raise RecipeError(
            where, [Problem("<file>", f"cannot read: {exc.strerror}", "check the path", where)]
        ) from exc
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError(
                "utf-8", data, data.index(b"\x00"), data.index(b"\x00") + 1, "NUL byte"
            )
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            where,
            [
                Problem(
                    "<file>",
                    f"not a text file ({exc.reason} at byte {exc.start})",
                    "give a UTF-8 YAML recipe; remove binary files from recipes/",
                    where,
                )
            ],
        ) from exc


def load_yaml_file(path: Path) -> Any:
    """A YAML file the project did not write itself in this process (a run's saved
    `recipe.yaml`, a study's endpoints file), read with every bound of `parse_yaml` and
    `read_text`; raises `RecipeError` naming the file."""
    return parse_yaml(read_text(Path(path)), str(path))
