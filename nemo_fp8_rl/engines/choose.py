"""Which engine runs a recipe here: the embedded CPU engine or NeMo RL, or why neither can.

`auto` picks `local` for `cluster.gpus_per_node: 0` and `nemo` otherwise; NeMo RL is imported only to
ask whether it is usable (`engines.nemo.available`).
"""

from __future__ import annotations

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.user_error import UNAVAILABLE, UserError


class EngineUnavailable(UserError):
    """The requested engine cannot run this recipe here: where, why, and what to do (exit 3)."""

    code = UNAVAILABLE


def choose_engine(recipe: Recipe, requested: str) -> str:
    """Pick `local` or `nemo` for a recipe, or explain why neither can run it."""
    if requested == "local" and not recipe.on_cpu:
        raise EngineUnavailable(
            recipe.name,
            f"asks for {recipe.config['cluster']['gpus_per_node']} GPUs per node; the local "
            "engine runs CPU recipes only (cluster.gpus_per_node: 0)",
            "use --engine nemo where NeMo RL is installed, or a recipe under recipes/tiny/",
        )
    if requested == "local" or (requested == "auto" and recipe.on_cpu):
        return "local"
    from nemo_fp8_rl.engines import nemo

    ok, why = nemo.available()
    if not ok:
        reason, _, how = why.partition(" To fix: ")
        raise EngineUnavailable(
            recipe.name,
            f"needs the NeMo RL engine, which is not usable here: {reason.rstrip('.')}",
            f"{how.rstrip('.') or 'install NeMo RL'}; or train a CPU recipe from recipes/tiny/ "
            "here, or send this one to a Slurm cluster with nemo_fp8_rl.submit",
        )
    return "nemo"


def require_nemo_rl(what: str) -> None:
    """Refuse `what` (e.g. `--preflight`) where NeMo RL is not usable, with how to install it."""
    from nemo_fp8_rl.engines import nemo

    ok, why = nemo.available()
    if not ok:
        reason, _, how = why.partition(" To fix: ")
        raise EngineUnavailable(
            what,
            f"NeMo RL is not usable here, so the launch cannot be rehearsed: {reason.rstrip('.')}",
            how.rstrip(".") or "install NeMo RL",
        )


def check_engine(
    recipe: Recipe,
    engine: str,
    *,
    here: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    outputs: bool = True,
) -> None:
    """Refuse, before anything starts, what `engine` would refuse once it runs `recipe`: the
    embedded engine's CPU rules and its refusal of hand-set output paths, or the NeMo RL
    engine's rules (`here`: with this machine's GPU) and the checks of hand-set output folders
    (`runs.outputs.check_hand_set`; `outputs=False` leaves them to the caller: `--seeds`
    checks each seed's folder). `train --dry-run` and `submit` call it too, so a recipe they
    accept is one the run accepts."""
    if engine == "local":
        from nemo_fp8_rl.engines.local.recipe_checks import (
            check_cpu_support,
            refuse_hand_set_paths,
        )

        check_cpu_support(recipe.config, recipe.name)
        refuse_hand_set_paths(recipe)
        return
    from nemo_fp8_rl.engines.nemo.driver.recipe_checks import EngineConfigError, check_recipe
    from nemo_fp8_rl.runs.outputs import check_hand_set

    problems = check_recipe(recipe, here=here)
    if problems:
        raise EngineConfigError(recipe.name, "cannot run on the NeMo RL engine", problems)
    if outputs:
        check_hand_set(recipe, resume=resume, overwrite=overwrite)
