"""`nemo_fp8_rl.completion bash`: a bash completion script for every command.

    eval "$(uv run nemo_fp8_rl.completion bash)"     # this shell
    uv run nemo_fp8_rl.completion bash > ~/.local/share/bash-completion/completions/nemo_fp8_rl

The script is generated from the commands themselves: each command's flags are read from the
options its `--help` lists, and those of each of its subcommands (`recipes list --help`), so a new
flag completes once it exists and a flag a command refuses is never offered; recipe names
(`--recipe`, `--config`, `recipes show|validate|cp`) come from `recipes/`, and every other value
completes as a path. Recipe names are matched as plain text and never expanded: a recipe file
named `$(touch pwned).yaml` completes as that name and runs nothing (`compgen -W` would expand
it). It completes the console scripts `nemo_fp8_rl.<command>` and `nemo_fp8_rl <command>`, and
the same after `uv run [uv's options]` (the README's form) or `python -m`: a completion for `uv`
hands every other `uv` command line to the completion `uv` had when the script was loaded (load
it after uv's own, `uv generate-shell-completion bash`), or to file names. Regenerate it after
adding recipes.
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
SUBCOMMANDS = re.compile(r"\{([a-z][\w,-]*)\}")
RECIPE_FLAGS = ("--recipe", "--config")


def _help(name: str, argv: list[str]) -> str:
    module = importlib.import_module(f"nemo_fp8_rl.cli.{name}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main([*argv, "--help"])
    return out.getvalue()


def option_flags(text: str) -> list[str]:
    """The flags of a `--help` text's option lists (a line that starts with an option), not
    those its prose, examples or exit codes mention."""
    found: list[str] = []
    for line in text.splitlines():
        if line.startswith("  -"):
            head = line[2:].split("  ", 1)[0]  # "-h, --help" or "--recipe RECIPE, --config RECIPE"
            found += FLAG.findall(head)
    return found


def subcommands(text: str) -> list[str]:
    """The subcommands a `--help` text lists under its positional arguments (`{a,b,c}`)."""
    section = text.split("positional arguments:", 1)[1] if "positional arguments:" in text else ""
    first = section.strip().splitlines()[0] if section.strip() else ""
    found = SUBCOMMANDS.fullmatch(first.strip())
    return found.group(1).split(",") if found else []


# Commands whose first word picks another parser outside argparse's subcommands
# (`submit status|logs|cancel JOB` has its own flags).
OTHER_PARSERS = {"submit": ["status"]}


def command_flags(name: str) -> list[str]:
    """The flags `nemo_fp8_rl.<name>` and each of its subcommands accept, in order, each once."""
    text = _help(name, [])
    flags = option_flags(text)
    for sub in [*subcommands(text), *OTHER_PARSERS.get(name, [])]:
        flags += option_flags(_help(name, [sub]))
    return [f for f in dict.fromkeys(flags) if f != "-h"]


def recipe_names() -> list[str]:
    """Every recipe as `train --recipe` takes it (`<folder>/<name>`), one a line in the script:
    a name that holds a line break or another control character is left out (the script
    compares names as text and never expands them, whatever else they hold)."""
    from nemo_fp8_rl.config.locations import find_recipes, short_name

    names = (short_name(p) for p in find_recipes())
    return sorted(n for n in names if n.isprintable())


def bash_script() -> str:
    """The completion functions and their `complete` lines (see the module docstring)."""
    cases = "\n".join(
        f"        {name}) flags={shlex.quote(' '.join(command_flags(name)))} ;;"
        for name in COMMANDS
    )
    return f"""# bash completion for nemo_fp8_rl (nemo_fp8_rl completion bash)
_nemo_fp8_rl_at() {{
    local s=$1 cur prev cmd i flags
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd="${{COMP_WORDS[s]##*/}}"
    i=$((s + 1))
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
_nemo_fp8_rl() {{
    _nemo_fp8_rl_at 0
}}
# `uv run [options] nemo_fp8_rl.<command> ...` and `uv run python -m nemo_fp8_rl[.<command>] ...`
_nemo_fp8_rl_uv_before="$(complete -p uv 2>/dev/null | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')"
[[ "$_nemo_fp8_rl_uv_before" == _nemo_fp8_rl_uv ]] && _nemo_fp8_rl_uv_before=""
_nemo_fp8_rl_uv() {{
    local j word
    for (( j = 1; j < COMP_CWORD; j++ )); do
        word="${{COMP_WORDS[j]##*/}}"
        if [[ "$word" == nemo_fp8_rl || "$word" == nemo_fp8_rl.* ]]; then
            _nemo_fp8_rl_at "$j"
            return 0
        fi
    done
    if [[ -n "$_nemo_fp8_rl_uv_before" ]]; then
        "$_nemo_fp8_rl_uv_before" "$@"
    else
        COMPREPLY=($(compgen -f -- "${{COMP_WORDS[COMP_CWORD]}}"))
    fi
}}
complete -o filenames -F _nemo_fp8_rl nemo_fp8_rl {" ".join(f"nemo_fp8_rl.{c}" for c in COMMANDS)}
complete -o filenames -F _nemo_fp8_rl_uv uv
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
