"""A worker that dies or raises inside NeMo RL's loop, as one located error with the way back.

`grpo_train` waits on its workers with `ray.get`; a dead actor surfaces as Ray's
`RayActorError` and a worker exception as `RayTaskError`, both deep inside NeMo RL with a
traceback that names neither the run nor what is safe to do. `located(...)` turns either into a
`UserError` (exit 1) that names the worker, the first line of its reason, the last checkpoint
NeMo RL kept (checkpoints are written atomically by NeMo RL's checkpoint manager: a step dir
appears only when complete) and the command that resumes from it.
"""

from __future__ import annotations

from pathlib import Path

from nemo_fp8_rl.config.user_error import UserError


def _first_line(text: str) -> str:
    """The first non-empty line of `text` (a Ray error's traceback follows it)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), text)


def _reason(exc: BaseException) -> tuple[str, str] | None:
    """(worker, reason) for Ray's actor and task errors; None for anything else."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        where = getattr(exc, "function_name", "a worker method")
        return str(where), f"{type(cause).__name__}: {_first_line(str(cause))}"
    if isinstance(exc, rex.RayActorError):
        text = str(exc)
        name = next((w for w in text.split() if "Worker" in w), "a worker")
        return name.strip(".,:'\""), "the actor died (" + _first_line(text)[:200] + ")"
    return None


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete `step_*` checkpoint NeMo RL kept (None: none yet)."""
    folder = Path(checkpoint_dir)
    steps = sorted(
        (p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]),
    )
    return steps[-1] if steps else None


def located(
    exc: BaseException, run_name: str, checkpoint_dir: str, resume: str
) -> UserError | None:
    """The located error for a worker fault (None: `exc` is not one, re-raise it as is)."""
    found = _reason(exc)
    if found is None:
        return None
    worker, reason = found
    kept = latest_checkpoint(checkpoint_dir)
    if kept is None:
        fix = f"nothing was checkpointed yet; fix the cause and start again ({resume.split(' --resume')[0]})"
    else:
        fix = f"the checkpoint {kept} is complete; fix the cause and resume with: {resume}"
    return UserError(f"{run_name}: {worker}", f"NeMo RL's loop stopped: {reason}", fix)
