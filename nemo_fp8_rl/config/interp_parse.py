"""Parse a config string into text and interpolations, with OmegaConf's grammar (the part of it
NeMo RL's configs use), so that a value is parsed once and what an interpolation returns is
never parsed again (an environment variable holding `${x}` stays `${x}`, as in OmegaConf).

A string is text with interpolations: `${a.b}` or `${.x}` (a key, absolute or relative; spaces
inside the braces are ignored) and `${name:arg, ...}` (a resolver). In the text, `\\${` is a
literal `${`, and `\\\\${...}` a backslash followed by an interpolation (2k backslashes before
`${` stand for k; one more makes the `${` literal); other backslashes are kept. A resolver
argument is a quoted string (`'a,b'`, in which interpolations still resolve, the result always
text), or a primitive: text up to the next unescaped `,` or `}` (`\\,` is a comma), spaces at
both ends dropped, read as null, a boolean, a whole or a decimal number when it is one, else as
text; an argument that is exactly one interpolation is that interpolation's value. List and
mapping arguments are refused. `encode_literal` is the inverse: the text that reads back as a
given literal string. tests/test_interpolate_omegaconf.py holds this to OmegaConf's answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

MAX_NESTING = 16  # interpolations inside interpolations, deeper than any config writes them

_RESOLVER = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_KEY = re.compile(r"\.*[^\s.${}\[\]:'\"\\]+(\.[^\s.${}\[\]:'\"\\]+)*|\.+")
_INT = re.compile(r"[+-]?(\d[\d_]*|0x[0-9a-fA-F_]+|0o[0-7_]+|0b[01_]+)")
_FLOAT = re.compile(
    r"[+-]?((\d[\d_]*)?\.\d[\d_]*([eE][+-]?\d+)?|\d[\d_]*\.?([eE][+-]?\d+)|\d[\d_]*\.|inf|nan)",
    re.I,
)
_ARG_ESCAPES = set("\\[]{}():=, \t'\"")


class ParseError(ValueError):
    """A string the grammar cannot read (an unclosed `${`, an unsupported argument)."""


@dataclass(frozen=True)
class Ref:
    """`${key}`: the value at `key` (dotted; leading dots are relative)."""

    key: str


@dataclass(frozen=True)
class Call:
    """`${name:args}`: a resolver applied to its arguments."""

    name: str
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Arg:
    """One resolver argument: its parts, and whether it was quoted (always text) or not."""

    parts: tuple[Part, ...]
    quoted: bool


Part = Union[str, Ref, Call]  # noqa: UP007 (a runtime alias: `|` of a str and classes)


def parse(text: str) -> tuple[Part, ...]:
    """`text` as literal strings and interpolations, in order (escapes already applied)."""
    parser = _Parser(text)
    parts = parser.top()
    return tuple(_joined(parts))


def has_interpolation(text: str) -> bool:
    """Whether `text` holds anything but literal text (cheap test first)."""
    return "${" in text and any(not isinstance(p, str) for p in parse(text))


def encode_literal(value: str) -> str:
    """The config text that `parse` reads back as exactly `value` (each `${` escaped, the
    backslashes before it doubled)."""
    out, i = [], 0
    while True:
        j = value.find("${", i)
        if j < 0:
            out.append(value[i:])
            return "".join(out)
        k = j
        while k > i and value[k - 1] == "\\":
            k -= 1
        out.append(value[i:k] + "\\" * (2 * (j - k) + 1) + "${")
        i = j + 2


def primitive(text: str) -> object:
    """An unquoted argument without interpolations, read as OmegaConf reads it."""
    low = text.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        return int(text.replace("_", ""), 0)
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    return text


def _joined(parts: list[Part]) -> list[Part]:
    """Adjacent literal strings merged (empty ones dropped)."""
    out: list[Part] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += part
                continue
        out.append(part)
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    def error(self, what: str) -> ParseError:
        return ParseError(f"{what} at character {self.pos + 1}")

    def top(self) -> list[Part]:
        """Top-level text: escapes before `${`, interpolations, literal text."""
        parts: list[Part] = []
        text, n = self.text, len(self.text)
        while self.pos < n:
            j = text.find("${", self.pos)
            if j < 0:
                parts.append(text[self.pos :])
                break
            k = j
            while k > self.pos and text[k - 1] == "\\":
                k -= 1
            slashes = j - k
            parts.append(text[self.pos : k] + "\\" * (slashes // 2))
            if slashes % 2:
                parts.append("${")
                self.pos = j + 2
                continue
            self.pos = j
            parts.append(self.interpolation())
        return parts

    def interpolation(self) -> Part:
        """`${...}` at `pos`: a key reference or a resolver call."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"interpolations nested deeper than {MAX_NESTING}")
        self.pos += 2
        self.skip_spaces()
        match = _RESOLVER.match(self.text, self.pos)
        after = match.end() if match else self.pos
        if match and self.text.startswith(":", self._spaces_end(after)):
            name = match.group(0)
            self.pos = self._spaces_end(after) + 1
            node: Part = Call(name, self.arguments())
        else:
            key = _KEY.match(self.text, self.pos)
            if key is None:
                raise self.error("expected a key or resolver:args after '${'")
            self.pos = key.end()
            self.skip_spaces()
            if not self.text.startswith("}", self.pos):
                raise self.error("expected '}' to close '${'")
            self.pos += 1
            node = Ref(key.group(0))
        self.depth -= 1
        return node

    def arguments(self) -> tuple[Arg, ...]:
        """Comma-separated arguments up to the closing `}` (an empty one is empty text)."""
        args: list[Arg] = []
        while True:
            args.append(self.argument())
            if self.pos >= len(self.text):
                raise self.error("expected '}' to close '${'")
            char = self.text[self.pos]
            self.pos += 1
            if char == "}":
                if len(args) == 1 and args[0].parts == () and not args[0].quoted:
                    return ()  # `${name:}`: no argument
                return tuple(args)

    def argument(self) -> Arg:
        self.skip_spaces()
        if self.pos < len(self.text) and self.text[self.pos] in "'\"":
            arg = Arg(tuple(_joined(self.quoted())), True)
            self.skip_spaces()
            if self.pos < len(self.text) and self.text[self.pos] not in ",}":
                raise self.error("expected ',' or '}' after a quoted argument")
            return arg
        if self.pos < len(self.text) and self.text[self.pos] in "[{":
            raise self.error("list and mapping arguments are not supported")
        return Arg(tuple(_joined(_strip(self.plain()))), False)

    def plain(self) -> list[Part]:
        """An unquoted argument up to an unescaped `,` or `}`."""
        parts: list[Part] = []
        text, n = self.text, len(self.text)
        while self.pos < n:
            char = text[self.pos]
            if char in ",}":
                return parts
            if text.startswith("${", self.pos):
                parts.append(self.interpolation())
            elif char == "\\" and self.pos + 1 < n and text[self.pos + 1] in _ARG_ESCAPES:
                parts.append(_Escaped(text[self.pos + 1]))
                self.pos += 2
            elif char in "[]{}'\"":
                raise self.error(f"unexpected {char!r} in an argument (quote the argument)")
            else:
                parts.append(char)
                self.pos += 1
        raise self.error("expected '}' to close '${'")

    def quoted(self) -> list[Part]:
        """A quoted argument: interpolations resolve inside; `\\'` is the quote itself."""
        quote = self.text[self.pos]
        self.pos += 1
        parts: list[Part] = []
        text, n = self.text, len(self.text)
        while self.pos < n:
            char = text[self.pos]
            if char == quote:
                self.pos += 1
                return parts
            if char == "\\" and self.pos + 1 < n and text[self.pos + 1] in (quote, "\\"):
                parts.append(text[self.pos + 1])
                self.pos += 2
            elif text.startswith("${", self.pos):
                parts.append(self.interpolation())
            else:
                parts.append(char)
                self.pos += 1
        raise self.error(f"unclosed quote {quote}")

    def skip_spaces(self) -> None:
        self.pos = self._spaces_end(self.pos)

    def _spaces_end(self, pos: int) -> int:
        while pos < len(self.text) and self.text[pos] in " \t":
            pos += 1
        return pos


class _Escaped(str):
    """A character written escaped (`\\,`): kept when the argument's spaces are stripped."""

    __slots__ = ()


def _strip(parts: list[Part]) -> list[Part]:
    """Spaces at both ends of an unquoted argument (one part per character) dropped; escaped
    ones are kept."""

    def space(part: Part) -> bool:
        return isinstance(part, str) and not isinstance(part, _Escaped) and part in (" ", "\t")

    start, end = 0, len(parts)
    while start < end and space(parts[start]):
        start += 1
    while end > start and space(parts[end - 1]):
        end -= 1
    return [str(p) if isinstance(p, _Escaped) else p for p in parts[start:end]]
