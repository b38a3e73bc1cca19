"""`nemo_fp8_rl.completion bash`: a bash completion script for every command.

    eval "$(uv run python -m nemo_fp8_rl completion bash)"     # this shell
    uv run python -m nemo_fp8_rl completion bash > ~/.local/share/bash-completion/completions/nemo_fp8_rl

The script is generated from the commands themselves: each command's flags are read from its
`--help` (so a new flag completes once it exists), recipe names (`--recipe`, `--config`,
`recipes show|validate|cp`) from `recipes/`, and every other value completes as a path. Recipe
names are matched as plain text and never expanded: a recipe file named `$(touch pwned).yaml`
completes as that name and runs nothing (`compgen -W` would expand it). It
completes the console scripts `nemo_fp8_rl.<command>` and `nemo_fp8_rl <command>` (in an
activated environment, or after `uv run`: `uv run nemo_fp8_rl.train --re<TAB>` completes
through uv's own arguments only if uv's completion passes them on, so activating `.venv` is the
sure way). Regenerate it after adding recipes.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex

from nemo_fp8_rl.cli.commands import COMMANDS
from nemo_fp8_rl.cli.common import ArgumentParser, run_main

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
RECIPE_FLAGS = ("--recipe", "--config")


def command_flags(name: str) -> list[str]:
    """The flags `nemo_fp8_rl.<name> --help` prints, in order, each once."""
    module = importlib.import_module(f"nemo_fp8_rl.cli.{name}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main(["--help"])
    found = dict.fromkeys(FLAG.findall(out.getvalue()))
    return [f for f in found if f not in ("-h",)]


def recipe_names() -> list[str]:
    """Every recipe as `train --recipe` takes it (`<folder>/<name>`), one a line in the script:
    a name that holds a line break or another control character is left out (the script
    compares names as text and never expands them, whatever else they hold)."""
    from nemo_fp8_rl.config.locations import find_recipes, short_name

    names = (short_name(p) for p in find_recipes())
    return sorted(n for n in names if n.isprintable())


def bash_script() -> str:
    """The completion function and its `complete` lines (see the module docstring)."""
    cases = "\n".join(
        f"        {name}) flags={shlex.quote(' '.join(command_flags(name)))} ;;"
        for name in COMMANDS
    )
    return f"""# bash completion for nemo_fp8_rl (nemo_fp8_rl completion bash)
_nemo_fp8_rl() {{
    local cur prev cmd i flags
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd="${{COMP_WORDS[0]##*/}}"
    i=1
    if [[ "$cmd" == nemo_fp8_rl ]]; then
        if (( COMP_CWORD == i )); then
            COMPREPLY=($(compgen -W {shlex.quote(" ".join(COMMANDS))} -- "$cur"))
            return 0
        fi
        cmd="${{COMP_WORDS[i]}}"
    else
        cmd="${{cmd#nemo_fp8_rl.}}"
    fi
    local recipes={shlex.quote(chr(10).join(recipe_names()))}
    if [[ "$prev" == --recipe || "$prev" == --config ]] || \\
       [[ "$cmd" == recipes && "$prev" =~ ^(show|validate|cp)$ ]]; then
        # names compared as plain text, never expanded (compgen -W would run $(...) in a name)
        local name
        COMPREPLY=()
        while IFS= read -r name; do
            [[ -n "$name" && "$name" == "$cur"* ]] && COMPREPLY+=("$name")
        done <<< "$recipes"
        mapfile -t -O "${{#COMPREPLY[@]}}" COMPREPLY < <(compgen -f -- "$cur")
        return 0
    fi
    case "$cmd" in
{cases}
        *) flags="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    else
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
}}
complete -o filenames -F _nemo_fp8_rl nemo_fp8_rl {" ".join(f"nemo_fp8_rl.{c}" for c in COMMANDS)}
"""


def main(argv: list[str] | None = None) -> int:
    """Print the completion script for `shell`."""
    parser = ArgumentParser(
        prog="nemo_fp8_rl.completion",
        description="Print a bash completion script for every nemo_fp8_rl command.",
        examples=['eval "$(nemo_fp8_rl.completion bash)"'],
    )
    parser.add_argument("shell", choices=["bash"], help="the shell to complete in")
    parser.parse_args(argv)
    print(bash_script(), end="")
    return 0


entry = run_main(main)
