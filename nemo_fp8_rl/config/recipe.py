"""Recipes: `load_recipe` (load + validate); discovery and lookup by name live in `locations`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.interpolate import is_missing, lookup, resolve_all
from nemo_fp8_rl.config.loader import apply_overrides, load_chain
from nemo_fp8_rl.config.locations import (
    base_config_path,
    find_recipes,
    project_root,
    recipes_dir,
    resolve_ref,
    short_name,
)
from nemo_fp8_rl.config.output_paths import hand_set, place_issues
from nemo_fp8_rl.config.placement import on_cpu
from nemo_fp8_rl.config.required_keys import check_env_names, check_missing, deleted_keys
from nemo_fp8_rl.config.rules import check_rules
from nemo_fp8_rl.config.schema import (
    DERIVED,
    PATH_KEYS,
    check_keys,
    check_values,
    source_of,
)

__all__ = [
    "Recipe",
    "base_config_path",
    "find_recipes",
    "load_recipe",
    "project_root",
    "recipes_dir",
    "resolve_ref",
    "short_name",
]


@lru_cache(maxsize=1)
def _resolved_base() -> dict:
    config, _ = load_chain(base_config_path())
    resolved, _ = resolve_all(config)
    return resolved


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe: the resolved NeMo RL config plus the project's sections."""

    name: str
    path: Path
    config: dict
    provenance: dict[str, str] = field(repr=False)
    run_dir: Path
    # the recipe as the command line named it and the overrides it gave, in order: what a
    # printed command that runs this recipe again (`runs.resume`) repeats
    ref: str = field(default="", repr=False)
    overrides: tuple[str, ...] = field(default=(), repr=False)

    def section(self, dotted: str) -> Any:
        """The config value at a dotted path (a dict for sections)."""
        value = lookup(self.config, dotted)
        if is_missing(value):
            raise KeyError(f"{dotted} is not in recipe {self.name}")
        return value

    @property
    def on_cpu(self) -> bool:
        """Whether the recipe runs on CPU (`placement.on_cpu`)."""
        return on_cpu(self.config)

    def to_yaml(self, with_sources: bool = False) -> str:
        """The resolved config as YAML; with sources, each leaf line ends with `# <file>`."""
        text = yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False, width=120)
        if not with_sources:
            return text
        return annotate_sources(text, self.provenance)


def annotate_sources(text: str, prov: dict[str, str]) -> str:
    """Append the source file of each leaf key as a comment (paths shown relative to the project)."""
    root = str(project_root().resolve()) + "/"
    out, stack = [], []
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = (len(line) - len(stripped)) // 2
        if stripped.startswith("- ") or ":" not in stripped:
            out.append(line)
            continue
        key = stripped.split(":", 1)[0]
        stack[indent:] = [key]
        src = prov.get(".".join(stack))
        out.append(f"{line}  # {src.replace(root, '')}" if src else line)
    return "\n".join(out) + "\n"


def load_recipe(
    ref: str | Path, overrides: list[str] | tuple[str, ...] = (), run_dir: Path | None = None
) -> Recipe:
    """Load `ref` with its defaults chain and overrides, derive paths, validate; all problems at once."""
    path = resolve_ref(ref).resolve()
    config, prov = load_chain(path)
    issues = apply_overrides(config, list(overrides), prov)
    issues += [
        _derived_issue(key, prov[key]) for key in DERIVED if key in prov and key not in PATH_KEYS
    ]
    name = path.stem
    run_dir = Path(run_dir) if run_dir is not None else Path("runs") / name
    _derive(config, prov, name, run_dir)
    resolved, interp_issues = resolve_all(config)
    issues += [replace(i, file=source_of(prov, i.key)) for i in interp_issues]
    key_issues = check_keys(resolved, _resolved_base(), prov)
    issues += key_issues
    deleted = deleted_keys(overrides)
    issues += check_missing(resolved, _resolved_base(), prov, deleted, str(path))
    issues += check_env_names(resolved, prov)
    issues += check_values(resolved, prov)
    issues += place_issues(resolved, prov, run_dir)  # a hand-set output path: / , home, a link
    if not interp_issues and not any(i.what.startswith("expected ") for i in key_issues):
        issues += check_rules(resolved, prov)  # rules read typed values only
    if issues:
        raise RecipeError(str(path), issues)
    return Recipe(
        name=name,
        path=path,
        config=resolved,
        provenance=prov,
        run_dir=run_dir,
        ref=str(ref),
        overrides=tuple(overrides),
    )


def _derived_issue(key: str, source: str) -> Problem:
    """A derived key set by hand: say it is derived and what to use instead."""
    fix = (
        "the run name is the recipe file's name: copy the recipe to a new file to rename the run"
        if key == "logger.wandb.name"
        else "use --run-dir DIR to move the run's outputs (logs and checkpoints go under it)"
    )
    if source != "override":
        fix = f"remove it; {fix}"
    return Problem(
        key, "is derived from the recipe name and --run-dir, not set by hand", fix, source
    )


def _derive(config: dict, prov: dict[str, str], name: str, run_dir: Path) -> None:
    """Run name and output paths come from the recipe file name (or --run-dir); an output path
    set by hand (`PATH_KEYS`, as in NeMo RL's configs) is kept, made absolute from here."""
    logger = config.setdefault("logger", {})
    checkpointing = config.setdefault("checkpointing", {})
    paths = {
        "logger.log_dir": (logger, "log_dir", run_dir / "logs"),
        "checkpointing.checkpoint_dir": (checkpointing, "checkpoint_dir", run_dir / "checkpoints"),
    }
    for key, (node, leaf, default) in paths.items():
        value = node.get(leaf)
        if key in prov and isinstance(value, str) and value:
            node[leaf] = value if "${" in value else str(Path(value).expanduser().absolute())
        else:
            node[leaf] = str(default)
            prov[key] = "derived"
    for backend, key in (("wandb", "name"), ("swanlab", "name"), ("mlflow", "run_name")):
        logger.setdefault(backend, {})[key] = name
    for key in DERIVED:
        if key not in PATH_KEYS:
            prov[key] = "derived"


def hand_set_paths(recipe: Recipe, why: str, fix: str) -> list[Problem]:
    """One issue per output path (`PATH_KEYS`) the recipe or an override set by hand: `why`
    a command cannot use it, `fix` what to do instead."""
    return [
        Problem(key, why, fix, recipe.provenance[key])
        for key in PATH_KEYS
        if set_by_hand(recipe, key)
    ]


def set_by_hand(recipe: Recipe, key: str) -> bool:
    """Whether an output path (`PATH_KEYS`) came from a recipe file or override, not derived."""
    return hand_set(recipe.provenance, key)
