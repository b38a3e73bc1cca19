"""Pieces every command shares: recipe arguments, trailing overrides, error reporting."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from nemo_fp8_rl.config import RecipeError


def add_recipe_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """`--recipe R` plus trailing `dotted.key=value` overrides."""
    parser.add_argument(
        "--recipe",
        required=required,
        help="recipe path or short name, e.g. tiny/grpo-tiny-qwen3-cpu-fp8",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, checked by the same schema",
    )


def run_main(main: Callable[[list[str] | None], int]) -> Callable[[], None]:
    """Console-script wrapper: exit with main's code; recipe errors print cleanly (no traceback)."""

    def entry() -> None:
        try:
            code = main(None)
        except RecipeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            code = 130
        sys.exit(code)

    return entry
