"""An embedded run's actor that dies, as one located error with the command that resumes it.

The trainer and the rollout engine are Ray actors (`actors.make_actors`); the loop waits on them
with `ray.get`. One killed (out of memory, `kill -9`) surfaces as Ray's `RayActorError`, and one
that raises as `RayTaskError`, a traceback that names neither the run nor what is safe to do.
`located` turns either into a `UserError` (exit 1) naming the actor (Ray's `class_name`), the
last complete checkpoint (`checkpoint.latest_checkpoint`: written atomically, so the one
`latest` names is whole) and the run's own command line with `--resume`
(`runs.resume.train_command`: the recipe as named, its overrides, the run folder).
"""

from __future__ import annotations

import re
from pathlib import Path

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.local import checkpoint as ckpt
from nemo_fp8_rl.runs.resume import train_command

ACTORS = {"Trainer": "the trainer actor", "Rollout": "the rollout actor"}


def _actor(text: str) -> str:
    """The actor Ray's error text names (`class_name: Trainer`), as the run calls it."""
    found = re.search(r"class_name:\s*(\w+)", text) or re.search(r"ray::(\w+)", text)
    name = found.group(1) if found else ""
    return ACTORS.get(name, f"the {name} actor" if name else "an actor")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:200]


def located(exc: BaseException, recipe: Recipe) -> UserError | None:
    """The located error for an actor's death or exception (None: `exc` is neither)."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        what = f"{_actor(str(exc))} raised {type(cause).__name__}: {_first_line(str(cause))}"
    elif isinstance(exc, rex.RayActorError):
        what = f"{_actor(str(exc))} died ({_first_line(str(exc))})"
    else:
        return None
    kept = ckpt.latest_checkpoint(Path(recipe.run_dir) / "checkpoints")
    if kept is None:
        again = train_command(recipe, "local", "--overwrite")
        fix = f"nothing was checkpointed yet; fix the cause and start again with `{again}`"
    else:
        again = train_command(recipe, "local")
        fix = f"the checkpoint {kept} is complete; fix the cause and resume with `{again}`"
    return UserError(recipe.name, what, fix)
