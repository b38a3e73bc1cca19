"""Whole numbers read from text (YAML values, overrides, command-line arguments), bounded in size.

Python refuses to convert integers of more than 4,300 decimal digits to or from text (a
`ValueError` that, uncaught, is an internal error), and a long hexadecimal number converts but
then cannot be printed. No setting of this project needs more than a few dozen digits (a seed is
below 2**64, 20 digits), so every reader refuses a number longer than `MAX_INT_DIGITS`
characters before converting it, and says so where the number was written.
"""

from __future__ import annotations

MAX_INT_DIGITS = 40  # 2**128 has 39 digits


class NumberTooLong(ValueError):
    """A whole number written with more than `MAX_INT_DIGITS` characters."""


def too_long(text: str) -> str | None:
    """What is wrong with `text` as a whole number's digits (too long), or None when it is fine."""
    digits = len(text.strip().lstrip("+-").replace("_", ""))
    if digits <= MAX_INT_DIGITS:
        return None
    return f"a whole number of {digits:,} digits, more than the {MAX_INT_DIGITS} this reads"


def parse_int(text: str, base: int = 10) -> int:
    """`int(text, base)` for at most `MAX_INT_DIGITS` characters of digits.

    Raises:
        NumberTooLong: `text` is longer; ValueError: it is not a whole number.
    """
    problem = too_long(text)
    if problem is not None:
        raise NumberTooLong(problem)
    return int(text, base)
