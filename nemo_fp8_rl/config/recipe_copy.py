"""Copy a recipe to edit it: `nemo_fp8_rl.recipes cp R my.yaml` (as torchtune's `tune cp`).

The copy keeps the recipe's text, comments included; only its `defaults:` entries change, each
rewritten to a name that resolves from any folder: a recipe's short name
(`tiny/grpo-tiny-qwen3-cpu-bf16`), `configs/<...>` for a config of the project, or the absolute
path of a parent outside the project. Parents stay parents (not inlined), so the copy still
follows later fixes to the configs it builds on, and `recipes show --sources` still names them.

Nothing is written unless the copy resolves to exactly the configuration of the original
(checked on a temporary file beside the target, which is then renamed into place:
`safe_files.write_atomic`, so a full disk keeps the old file); an existing file is replaced only
with `overwrite`.

With `full`, the copy is the whole resolved configuration instead (as torchtune's `tune cp`
gives), every key in the file with a comment naming the file that set it, and no `defaults:`:
everything is there to edit, and later fixes of the configs it came from do not reach it.
The paths derived from the run name (`logger.log_dir`, ...) stay out, as in every recipe.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nemo_fp8_rl.config.loader import load_chain, parent_list
from nemo_fp8_rl.config.locations import portable_name, resolve_parent, resolve_ref
from nemo_fp8_rl.config.safe_files import refuse_link, write_atomic
from nemo_fp8_rl.config.safe_yaml import parse_yaml, read_text
from nemo_fp8_rl.config.user_error import UsageError

_PLAIN = re.compile(r"[\w./+@-]+")
_TOP_LEVEL = re.compile(r"[^\s#-]")
_DEFAULTS = re.compile(r"""(defaults|"defaults"|'defaults')\s*:""")  # the key, quoted or not


def _item(ref: str) -> str:
    """A list item for `ref`: plain when YAML reads it back as the same string, else quoted."""
    return ref if _PLAIN.fullmatch(ref) and parse_yaml(ref) == ref else json.dumps(ref)


def rewrite_defaults(text: str, parents: list[str]) -> str:
    """`text` with its top-level `defaults:` entry (one line or a block list) replaced by
    `parents` as a block list; other lines are kept as they are."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _DEFAULTS.match(line)), None)
    block = "defaults:\n" + "".join(f"  - {_item(p)}\n" for p in parents)
    if start is None:
        return block + text
    end = start + 1
    while end < len(lines) and not _TOP_LEVEL.match(lines[end]):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # blank lines after the list stay where they were
    return "".join(lines[:start]) + block + "".join(lines[end:])


def copy_text(src: Path) -> str:
    """The text of the copy of `src`: its `defaults:` rewritten to portable names."""
    text = read_text(src)
    data = parse_yaml(text, str(src)) or {}
    if not isinstance(data, dict) or data.get("defaults") is None:
        return text
    parents = [portable_name(resolve_parent(p, src)) for p in parent_list(data["defaults"], src)]
    new = rewrite_defaults(text, parents)
    copied = parse_yaml(new, str(src)) or {}
    if {k: v for k, v in copied.items() if k != "defaults"} != {
        k: v for k, v in data.items() if k != "defaults"
    } or copied.get("defaults") != parents:
        raise RuntimeError(f"rewriting the defaults of {src} changed other keys")
    return new


def full_text(src: Path, name: str) -> str:
    """The whole configuration `src` resolves to (before paths are derived from the run name
    and `${...}` interpolations resolved), each key commented with the file that set it."""
    import yaml

    from nemo_fp8_rl.config.recipe import annotate_sources

    config, prov = load_chain(src)
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=120)
    header = (
        f"# The full configuration of {name}, copied by `nemo_fp8_rl.recipes cp`.\n"
        "# No defaults: every key is here; the comment after a key names the file that set it\n"
        "# in the original. Run names and paths (log_dir, checkpoint_dir) derive from this\n"
        "# file's name, so they are left out.\n"
    )
    return header + annotate_sources(body, prov)


def copy_recipe(ref: str, dest: Path, overwrite: bool = False, full: bool = False) -> Path:
    """Write an editable copy of recipe `ref` to `dest` (a file, or a folder to hold one);
    with `full`, the whole resolved configuration (`full_text`).

    Raises:
        RecipeError: `ref` is not a recipe, or does not load.
        UsageError: `dest` exists (without `overwrite`), is the recipe itself, or is not .yaml.
    """
    src = resolve_ref(ref).resolve()
    if dest.is_dir():
        dest = dest / src.name
    if dest.suffix not in (".yaml", ".yml"):
        raise UsageError(
            str(dest),
            "not a .yaml file name",
            "end the name in .yaml (the copy's runs are named after the file)",
        )
    if dest.exists() and dest.resolve() == src:
        raise UsageError(str(dest), "is the recipe being copied", "give a new file name")
    if dest.exists() and not overwrite:
        raise UsageError(
            str(dest), "already exists", "give a new file name, or --overwrite to replace it"
        )
    if not dest.parent.is_dir():
        raise UsageError(
            str(dest.parent), "no such folder", f"create it first (mkdir -p {dest.parent})"
        )
    refuse_link(dest)
    text = full_text(src, ref) if full else copy_text(src)
    original = load_chain(src)[0]

    def same_configuration(tmp: Path) -> None:
        if load_chain(tmp)[0] != original:
            raise RuntimeError(f"the copy of {src} does not resolve to the same configuration")

    write_atomic(dest, text, mode=0o644, check=same_configuration)
    return dest
