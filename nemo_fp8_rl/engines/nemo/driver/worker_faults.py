"""A worker that dies or raises inside NeMo RL's loop, as one located error with the way back.

`grpo_train` waits on its workers with `ray.get`; a dead actor surfaces as Ray's
`RayActorError` and a worker exception as `RayTaskError`, both deep inside NeMo RL with a
traceback that names neither the run nor what is safe to do. `located(...)` turns either into a
`UserError` (exit 1) that names the worker, the first line of its reason, the last checkpoint
NeMo RL kept (checkpoints are written atomically by NeMo RL's checkpoint manager: a step dir
appears only when complete) and the command that resumes from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.user_error import UserError


def _first_line(text: str) -> str:
    """The first non-empty line of `text` (a Ray error's traceback follows it)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), text)


def _one_line(text: str, limit: int = 600) -> str:
    """A worker exception's message on one line: its lines up to the first traceback line,
    joined with '; ' (a refusal lists its problems on the lines after the first)."""
    lines = []
    for line in text.splitlines():
        if line.strip().startswith(("Traceback", 'File "')):
            break
        if line.strip():
            lines.append(line.strip().rstrip(":"))
    joined = "; ".join(lines) or text
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def _reason(exc: BaseException) -> tuple[str, str] | None:
    """(worker, reason) for Ray's actor and task errors; None for anything else."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        title = str(getattr(exc, "proctitle", "") or "").removeprefix("ray::")
        where = getattr(exc, "function_name", None) or title or "a worker method"
        message = _one_line(str(cause)).removeprefix("error: ")
        return str(where), f"{type(cause).__name__}: {message}"
    if isinstance(exc, rex.RayActorError):
        text = str(exc)
        name = next((w for w in text.split() if "Worker" in w), "a worker")
        return name.strip(".,:'\""), "the actor died (" + _first_line(text)[:200] + ")"
    return None


def is_fault(exc: BaseException) -> bool:
    """Whether `exc` is a worker's death or exception (Ray's actor or task error)."""
    import ray.exceptions as rex

    return isinstance(exc, rex.RayTaskError | rex.RayActorError)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete `step_*` checkpoint NeMo RL kept (None: none yet)."""
    folder = Path(checkpoint_dir)
    steps = sorted(
        (p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
        key=lambda p: int(p.name[5:]),
    )
    return steps[-1] if steps else None


def dead_workers(owners: tuple[Any, ...], timeout_s: float = 10.0) -> list[str]:
    """The class names of the actors of `owners`' worker groups (NeMo RL's `VllmGeneration`,
    `Policy`) that are dead. Each actor is asked Ray's readiness call; a dead one answers at
    once with Ray's `ActorDiedError` (`class_name: ...`), a busy one is counted alive."""
    import ray
    import ray.exceptions as rex

    handles = [
        w
        for owner in owners
        for w in (getattr(getattr(owner, "worker_group", None), "workers", None) or [])
    ]
    if not handles:
        return []
    probes = [h.__ray_ready__.remote() for h in handles]
    done, _ = ray.wait(probes, num_returns=len(probes), timeout=timeout_s)
    dead = []
    for probe in done:
        try:
            ray.get(probe)
        except rex.RayActorError as exc:
            found = re.search(r"class_name:\s*(\w+)", str(exc))
            dead.append(found.group(1) if found else "a worker")
    return dead


def located(
    exc: BaseException,
    run_name: str,
    checkpoint_dir: str,
    resume: str,
    start: str,
    dead: list[str] | None = None,
) -> UserError | None:
    """The located error for a worker fault (None: `exc` is not one, re-raise it as is).
    `resume` and `start` are the run's own command line (`runs.resume.train_command`) with
    `--resume` and with `--overwrite`. `dead` (`dead_workers`): the actors found dead, named
    first: a vLLM actor that dies inside a refit surfaces as the trainer's error (its ZeroMQ
    send times out), not as the dead actor's."""
    found = _reason(exc)
    if found is None:
        return None
    worker, reason = found
    others = [d for d in dead or [] if d not in worker]
    if others:
        worker = " and ".join(dict.fromkeys(others))
        reason = f"the actor died; the loop then stopped at {found[0]}: {found[1]}"
    kept = latest_checkpoint(checkpoint_dir)
    if kept is None:
        fix = f"nothing was checkpointed yet; fix the cause and start again with `{start}`"
    else:
        fix = f"the checkpoint {kept} is complete; fix the cause and resume with `{resume}`"
    return UserError(f"{run_name}: {worker}", f"NeMo RL's loop stopped: {reason}", fix)


def shut_down_workers(*owners: Any) -> None:
    """Shut down the worker groups of NeMo RL's `VllmGeneration` / `Policy` objects, also
    when a worker is dead.

    NeMo RL's `RayWorkerGroup.shutdown` lets a dead actor's `RayActorError` escape before it
    kills the other actors and forgets them, so the owner's `__del__` runs the shutdown again
    at interpreter exit, after Ray is gone, and Ray's auto-init then waits on the stopped
    cluster forever. After the owner's own shutdown, `shutdown(force=True)` kills what is left
    and clears the group.
    """
    for owner in owners:
        if owner is None:
            continue
        try:
            owner.shutdown()
        except Exception as exc:  # noqa: BLE001 - a dead worker; the forced pass follows
            print(f"{type(owner).__name__}.shutdown: {type(exc).__name__}: {_first_line(str(exc))}")
        group = getattr(owner, "worker_group", None)
        if group is not None:
            group.shutdown(force=True)
