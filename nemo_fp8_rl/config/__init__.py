"""Recipes as validated NeMo RL configs: `load_recipe(ref, overrides)` returns a `Recipe`."""

from nemo_fp8_rl.config.errors import Problem, RecipeError
from nemo_fp8_rl.config.recipe import (
    Recipe,
    find_recipes,
    load_recipe,
    project_root,
    resolve_ref,
    short_name,
)

__all__ = [
    "Problem",
    "Recipe",
    "RecipeError",
    "find_recipes",
    "load_recipe",
    "project_root",
    "resolve_ref",
    "short_name",
]
