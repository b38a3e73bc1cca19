"""Which engine runs a recipe here: the embedded CPU engine or NeMo RL, or why neither can.

`auto` picks `local` for `cluster.gpus_per_node: 0` and `nemo` otherwise; NeMo RL is imported only to
ask whether it is usable (`engines.nemo.available`).
"""

from __future__ import annotations

from nemo_fp8_rl.config import Recipe


class EngineUnavailable(RuntimeError):
    """The requested engine cannot run this recipe here; the message says why and what to do."""


def choose_engine(recipe: Recipe, requested: str) -> str:
    """Pick `local` or `nemo` for a recipe, or explain why neither can run it."""
    on_cpu = recipe.config["cluster"]["gpus_per_node"] == 0
    if requested == "local" and not on_cpu:
        raise EngineUnavailable(
            f"{recipe.name} asks for {recipe.config['cluster']['gpus_per_node']} GPUs per node; the local engine runs "
            "CPU recipes only (cluster.gpus_per_node: 0). Use --engine nemo, or a recipe under recipes/tiny/."
        )
    if requested == "local" or (requested == "auto" and on_cpu):
        return "local"
    from nemo_fp8_rl.engines import nemo

    ok, why = nemo.available()
    if not ok:
        raise EngineUnavailable(
            f"{recipe.name} needs the NeMo RL engine, which is not usable here: {why}"
        )
    return "nemo"
