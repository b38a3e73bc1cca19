"""Required keys: every key of the base config must be in a resolved recipe.

NeMo RL and the engines read most keys with brackets, so a key that a recipe lacks (a file
without `defaults:`, or a `~key` override) would fail deep inside a worker; here it is a located
issue at load time. Free-form sections (`schema.OPEN`) are required too but hold whatever keys
they like, and a section whose `enabled` is false may hold only that (NeMo RL's `...Disabled`
configs). `check_env_names` holds the one link into a free-form section: every `data.*.env_name`
names a section of `env` (the environment NeMo RL starts for that data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo_fp8_rl.config.errors import Problem
from nemo_fp8_rl.config.schema import DERIVED, OPEN, source_of

# A recipe missing more base keys than this gets one summary issue instead of one per key.
MAX_MISSING_LISTED = 5


def deleted_keys(overrides: Sequence[str]) -> set[str]:
    """The keys `~key[=value]` overrides delete."""
    return {o[1:].partition("=")[0].strip() for o in overrides if o.startswith("~")}


def check_missing(
    config: dict, base: dict, prov: dict[str, str], deleted: set[str], recipe: str
) -> list[Problem]:
    """Issues for the keys of `base` that `config` lacks; a missing section is one issue, and
    the source is the override that deleted the key, else the file that should hold it."""
    issues: list[Problem] = []
    _check_present(config, base, "", prov, deleted, recipe, issues)
    by_file = [i for i in issues if i.file != "override"]
    if len(by_file) > MAX_MISSING_LISTED:  # a file without `defaults:`: one line, not dozens
        keys = ", ".join(i.key for i in by_file[:MAX_MISSING_LISTED])
        summary = Problem(
            "<file>",
            f"lacks {len(by_file)} keys or sections of the base config ({keys}, ...)",
            "inherit them: list configs/base/grpo.yaml (or a recipe) in defaults:",
            recipe,
        )
        issues = [summary, *(i for i in issues if i.file == "override")]
    return issues


def _check_present(
    node: dict,
    base: dict,
    prefix: str,
    prov: dict[str, str],
    deleted: set[str],
    recipe: str,
    issues: list[Problem],
) -> None:
    if node.get("enabled") is False:
        return
    for key, expected in base.items():
        path = f"{prefix}{key}"
        if path in DERIVED:
            continue
        if path in OPEN:  # the section is required (empty or not); what it holds is free-form
            if key not in node:
                issues.append(_missing(path, expected, prov, deleted, recipe))
        elif key not in node or _only_derived(node[key], path):
            issues.append(_missing(path, expected, prov, deleted, recipe))
        elif isinstance(expected, dict) and isinstance(node[key], dict):
            _check_present(node[key], expected, f"{path}.", prov, deleted, recipe, issues)


def _only_derived(value: Any, path: str) -> bool:
    """A section holding only keys derived from the run name (re-created after a deletion)."""
    return isinstance(value, dict) and all(
        f"{path}.{k}" in DERIVED or _only_derived(v, f"{path}.{k}") for k, v in value.items()
    )


def _missing(
    path: str, expected: Any, prov: dict[str, str], deleted: set[str], recipe: str
) -> Problem:
    parts = path.split(".")
    by = next(
        (k for k in deleted if k in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}), None
    )
    shown = "" if isinstance(expected, dict) else f" (the base config has {expected!r})"
    if by is not None:
        change = f"{path}.<key>=<value>" if isinstance(expected, dict) else f"{path}=<value>"
        source, fix = "override", f"drop ~{by}; set {change} to change it{shown}"
    else:
        source = source_of(prov, path)
        source = recipe if source == "?" else source
        fix = (
            f"add it{shown}, or inherit every base key: list configs/base/grpo.yaml (or a recipe) "
            "in defaults:"
        )
    return Problem(path, "missing (every key of the base config is required)", fix, source)


def check_env_names(config: dict, prov: dict[str, str]) -> list[Problem]:
    """Every `data.<section>.env_name` names a section of `env` (deleting `~env.math` while
    `data.default.env_name` is `math` would fail in NeMo RL's environment setup)."""
    data, env = config.get("data"), config.get("env")
    if not isinstance(data, dict) or not isinstance(env, dict):
        return []
    issues = []
    for section, body in data.items():
        name = body.get("env_name") if isinstance(body, dict) else None
        if isinstance(name, str) and name not in env:
            have = ", ".join(map(str, env)) or "none"
            issues.append(
                Problem(
                    f"data.{section}.env_name",
                    f"names env.{name}, which the recipe does not have (env sections: {have})",
                    f"keep env.{name}, or set data.{section}.env_name to one of the env sections",
                    source_of(prov, f"data.{section}.env_name"),
                )
            )
    return issues
