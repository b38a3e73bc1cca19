"""Where recipes and configs live, and how a name becomes a file.

A recipe is named by a path or by its short name (`tiny/grpo-tiny-qwen3-cpu-fp8`: the path under
`recipes/` without `.yaml`, or just the file stem when it is unique). A `defaults:` parent is a
path relative to the file that names it (NeMo RL's rule); when no such file exists it may also be
a short name: a recipe's, or a config's under `configs/` (`configs/precision/fp8-blockwise`, or
`precision/fp8-blockwise`). An unknown name gets the closest known names, not the whole list.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from nemo_fp8_rl.config.errors import Problem, RecipeError


def project_root() -> Path:
    """Folder holding `recipes/` and `configs/`: `NEMO_FP8_RL_HOME`, the source checkout, or the package data."""
    env = os.environ.get("NEMO_FP8_RL_HOME")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "recipes").is_dir():
        return checkout
    return Path(__file__).resolve().parents[1] / "_data"


def recipes_dir() -> Path:
    return project_root() / "recipes"


def configs_dir() -> Path:
    return project_root() / "configs"


def base_config_path() -> Path:
    return configs_dir() / "base" / "grpo.yaml"


def find_recipes() -> list[Path]:
    """Every recipe file, sorted."""
    return sorted(recipes_dir().rglob("*.yaml"))


def short_name(path: Path) -> str:
    """`qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8` for a file under recipes/."""
    try:
        return str(path.resolve().relative_to(recipes_dir().resolve()).with_suffix(""))
    except ValueError:
        return path.stem


def portable_name(path: Path) -> str:
    """The name a `defaults:` entry can use for `path` from any folder: a recipe's short name,
    `configs/<...>` for a config, else the absolute path."""
    path = path.resolve()
    for folder, prefix in ((recipes_dir(), ""), (configs_dir(), "configs/")):
        try:
            return prefix + str(path.relative_to(folder.resolve()).with_suffix(""))
        except ValueError:
            continue
    return str(path)


def closest_names(name: str, limit: int = 3) -> list[str]:
    """Up to `limit` recipe short names closest to `name` (by whole name or by file stem)."""
    names = [short_name(p) for p in find_recipes()]
    by_stem = {Path(n).name: n for n in names}
    stem = Path(name.removesuffix(".yaml")).name
    close = difflib.get_close_matches(name.removesuffix(".yaml"), names, n=limit, cutoff=0.6)
    close += [by_stem[s] for s in difflib.get_close_matches(stem, list(by_stem), n=limit)]
    return list(dict.fromkeys(close))[:limit]


def suggestion(name: str) -> str:
    """The fix for an unknown recipe name: the closest names, and where the full list is."""
    close = closest_names(name)
    listing = "`nemo_fp8_rl.recipes list` shows every recipe"
    if close:
        return f"did you mean {' or '.join(close)}? ({listing}; a path to a .yaml file works too)"
    return f"give a path to a .yaml file or a recipe name; {listing}"


def _by_name(name: str) -> Path | None:
    """The recipe or config file a short name stands for, or None."""
    stem = name.removesuffix(".yaml")
    folders = [recipes_dir(), configs_dir()]
    for prefix, folder in (("recipes/", recipes_dir()), ("configs/", configs_dir())):
        if stem.startswith(prefix):
            stem, folders = stem.removeprefix(prefix), [folder]
    for folder in folders:
        candidate = folder / f"{stem}.yaml"
        if candidate.is_file():
            return candidate
    return None


def resolve_ref(ref: str | Path, where: str = "--recipe") -> Path:
    """A recipe reference -> file: a path, `model/name` (with or without .yaml), or a unique file stem."""
    path = Path(ref)
    if path.is_file() or (path.exists() and not path.is_dir()):
        return path  # a FIFO or device is refused by the reader, by name
    if path.is_dir():
        raise RecipeError(
            str(ref), [Problem(where, "is a folder", "give a .yaml recipe file", str(ref))]
        )
    stem = str(ref).removesuffix(".yaml")
    candidate = recipes_dir() / f"{stem}.yaml"
    if candidate.is_file():
        return candidate
    matches = [p for p in find_recipes() if p.stem == Path(stem).name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = " or ".join(short_name(p) for p in matches)
        issue = Problem(where, "ambiguous recipe name", f"give one of {names}", str(ref))
    else:
        issue = Problem(where, "no such recipe file or name", suggestion(str(ref)), str(ref))
    raise RecipeError(str(ref), [issue])


def resolve_parent(parent: str, declaring: Path) -> Path:
    """A `defaults:` entry of `declaring` -> file: a path (relative to `declaring`), else a
    recipe's or a config's short name."""
    path = Path(parent)
    candidate = path if path.is_absolute() else declaring.parent / path
    if candidate.is_file():
        return candidate
    named = None if path.is_absolute() else _by_name(parent)
    if named is None and not path.is_absolute() and "/" not in parent.removesuffix(".yaml"):
        matches = [p for p in find_recipes() if p.stem == parent.removesuffix(".yaml")]
        named = matches[0] if len(matches) == 1 else None
    if named is not None:
        return named
    close = closest_names(parent)
    hint = f"did you mean {' or '.join(close)}? Or fix" if close else "fix"
    issue = Problem(
        "defaults",
        f"parent {parent!r} not found (looked at {candidate}, and for a recipe or a config of "
        "that name)",
        f"{hint} the path (relative to this file), or give a short name such as "
        "tiny/grpo-tiny-qwen3-cpu-bf16 or configs/precision/fp8-blockwise",
        str(declaring),
    )
    raise RecipeError(str(declaring), [issue])
