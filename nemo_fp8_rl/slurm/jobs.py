"""Submit, inspect and cancel jobs with Slurm's own commands (sbatch, squeue, scontrol, scancel).

`write_job_files` puts the frozen recipe and the rendered script into `<run_dir>/slurm/`, and
`submit` hands the script to `sbatch --parsable`. Job state is looked up in the order that works
with and without Slurm accounting: `scontrol show job` (queued, running, and finished jobs for
MinJobAge), then `squeue`, then `sacct` (accounting, for jobs the controller has forgotten).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UserError, shown

FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
_JOB_ID = re.compile(r"\d+(_\d+)?")


class SlurmError(UserError, RuntimeError):
    """A Slurm command failed or is missing; the message holds the command and its output."""


@dataclass(frozen=True)
class JobStatus:
    """State of one job as Slurm reports it (`exit_code` as `code:signal`, empty when unknown)."""

    job_id: str
    state: str
    exit_code: str = ""

    @property
    def finished(self) -> bool:
        """True once the job is in a final state (COMPLETED, FAILED, CANCELLED, ...)."""
        return self.state in FINAL_STATES


def check_job_id(job_id: str) -> str:
    """A Slurm job id (`123` or `123_4`); anything else is refused before reaching a command."""
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError(
            f"job id {job_id!r}",
            "not a Slurm job id (digits, or digits_digits for an array task)",
            "pass the number sbatch printed",
        )
    return job_id


MAX_TIMEOUT_S = 3600.0  # a Slurm client command that has not answered in an hour never will


def command_timeout() -> float:
    """Seconds a Slurm client command may take to answer: `NEMO_FP8_RL_SLURM_TIMEOUT_S`, else 60
    (a controller that is down or overloaded otherwise blocks every command for good)."""
    text = os.environ.get("NEMO_FP8_RL_SLURM_TIMEOUT_S", "")
    try:
        value = float(text) if text else 60.0
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise SlurmError(
            f"NEMO_FP8_RL_SLURM_TIMEOUT_S={shown(text)!r}",
            f"not a finite number of seconds > 0 and at most {MAX_TIMEOUT_S:g}",
            "set it to e.g. 60, or unset it",
        )
    return value


def _answer(cmd: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """Run `cmd` in its own process group; one that does not answer within `timeout` seconds is
    killed with everything it started, and reported as a `SlurmError`."""
    timeout = command_timeout() if timeout is None else timeout
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SlurmError(
            f"{' '.join(cmd)}",
            f"no answer in {timeout:g} s (the Slurm controller may be down or overloaded)",
            "check the cluster with sinfo and run it again; "
            "NEMO_FP8_RL_SLURM_TIMEOUT_S sets the wait",
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _run(
    cmd: list[str],
    check: bool = True,
    timeout: float | None = None,
    fix: str = "read Slurm's message; check the job id and that the cluster is up (sinfo)",
) -> subprocess.CompletedProcess:
    """Run a Slurm client command; a missing command or (with `check`) a failure is a
    `SlurmError` whose line says which command, what Slurm answered, and `fix`."""
    if shutil.which(cmd[0]) is None:
        raise SlurmError(
            f"{cmd[0]}",
            "not found (Slurm's client commands are not installed here)",
            "run on a Slurm login node, or start a local cluster with scripts/local-slurm.sh up",
        )
    proc = _answer(cmd, timeout)
    if check and proc.returncode != 0:
        said = " ".join(proc.stderr.split()).rstrip(".") or "no message"
        raise SlurmError(
            f"{' '.join(cmd)}", f"failed (exit {proc.returncode}): {said}", f"{fix.rstrip('.')}"
        )
    return proc


def frozen_recipe_text(recipe: Any) -> str:
    """The resolved recipe as YAML, without the keys `load_recipe` derives from the run name.

    Loading this file again (with the same `--run-dir`) gives the same config: it is the exact
    configuration the job trains with, independent of later edits to `recipes/` or `configs/`.
    An output path set by hand (`checkpointing.checkpoint_dir`, `logger.log_dir`) is kept, and
    a literal `${` in a value is written escaped (`interpolate.escape_literals`).
    """
    from nemo_fp8_rl.config.interpolate import escape_literals
    from nemo_fp8_rl.config.schema import DERIVED

    config = escape_literals(copy.deepcopy(recipe.config))
    provenance = getattr(recipe, "provenance", {})
    for dotted in DERIVED:
        if provenance.get(dotted, "derived") != "derived":
            continue  # set by hand: the job writes where the user said
        *parents, leaf = dotted.split(".")
        node = config
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
    header = f"# Frozen copy of {recipe.path} as resolved at submission (derived keys removed).\n"
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=120)


def write_job_files(recipe: Any, script: str, log_root: Path) -> tuple[Path, Path]:
    """Write `<log_root>/<name>.yaml` (frozen recipe) and `<log_root>/<name>.sbatch`."""
    log_root.mkdir(parents=True, exist_ok=True)
    recipe_file = log_root / f"{recipe.name}.yaml"
    write_atomic(recipe_file, frozen_recipe_text(recipe))
    script_file = log_root / f"{recipe.name}.sbatch"
    write_atomic(script_file, script, mode=0o755)
    return recipe_file, script_file


def check_syntax(script: Path) -> None:
    """`bash -n` on the rendered script: refuse to submit something that does not parse."""
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        said = " ".join(proc.stderr.split()).rstrip(".")
        raise SlurmError(
            script,
            f"the rendered script does not parse ({said})",
            "check --template and the recipe's slurm.setup_command and slurm.env values",
        )


def submit(script: Path) -> str:
    """`sbatch --parsable SCRIPT` from the script's folder; returns the job id."""
    check_syntax(script)
    proc = _run(
        ["sbatch", "--parsable", str(script)],
        fix="check the Slurm settings it names (--account, --partition, --time, --nodes, "
        "--container, or the recipe's slurm section) and run again; the job files are kept "
        f"in {script.parent}",
    )
    # `--parsable` prints `<id>[;<cluster>]`; a site's job_submit plugin or sbatch itself may
    # print lines (`INFO: ...`) before it, so the id is the last line that reads as one.
    lines = [line.strip().split(";")[0] for line in proc.stdout.splitlines() if line.strip()]
    ids = [line for line in lines if _JOB_ID.fullmatch(line)]
    return check_job_id(ids[-1] if ids else (lines[-1] if lines else ""))


def _scontrol_records(job_id: str) -> list[dict[str, str]]:
    """`scontrol show job -o JOB`: one record per line (an array job has one per task)."""
    proc = _run(["scontrol", "show", "job", "-o", job_id], check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    records = []
    for line in proc.stdout.strip().splitlines():
        # `Key=Value` pairs separated by spaces; values (JobName, paths) may hold spaces themselves.
        parts = re.split(r" (?=[A-Za-z][A-Za-z/:]*=)", line.strip())
        records.append(dict(p.split("=", 1) for p in parts if "=" in p))
    return records


def _scontrol_fields(job_id: str) -> dict[str, str]:
    records = _scontrol_records(job_id)
    return records[0] if len(records) == 1 else {}


def array_tasks(job_id: str) -> list[JobStatus]:
    """The tasks of array job `job_id` (`<job>_<task>`, pending ones as `<job>_[range]`), by
    task id; empty for a job that is not an array or that the controller has forgotten."""
    check_job_id(job_id)
    tasks = [
        JobStatus(
            f"{r['ArrayJobId']}_{r['ArrayTaskId']}",
            r.get("JobState", "UNKNOWN"),
            r.get("ExitCode", ""),
        )
        for r in _scontrol_records(job_id)
        if r.get("ArrayTaskId") and r.get("ArrayJobId") == job_id
    ]
    return sorted(tasks, key=lambda t: t.job_id)


def _array_state(tasks: list[JobStatus]) -> JobStatus | None:
    """One state for a whole array: the tasks' common state; else RUNNING while any task is not
    final; else COMPLETED only if all completed, otherwise FAILED."""
    if not tasks:
        return None
    job_id = tasks[0].job_id.split("_")[0]
    states = {t.state for t in tasks}
    if len(states) == 1:
        return JobStatus(job_id, states.pop())
    if any(not t.finished for t in tasks):
        return JobStatus(job_id, "RUNNING" if "RUNNING" in states else "PENDING")
    return JobStatus(job_id, "FAILED")


def _first_line(cmd: list[str]) -> str:
    proc = _run(cmd, check=False)
    lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    return lines[0].strip() if lines else ""


def job_status(job_id: str) -> JobStatus:
    """Current state of `job_id`: scontrol, then squeue, then sacct; `UNKNOWN` if none knows it.

    For an array job (`job_id` without `_<task>`) the state of the whole array (`_array_state`);
    `array_tasks` gives each task's.
    """
    check_job_id(job_id)
    array = _array_state(array_tasks(job_id)) if "_" not in job_id else None
    if array is not None:
        return array
    fields = _scontrol_fields(job_id)
    if fields.get("JobState"):
        return JobStatus(job_id, fields["JobState"], fields.get("ExitCode", ""))
    state = _first_line(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if state:
        return JobStatus(job_id, state)
    if shutil.which("sacct"):
        line = _first_line(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"])
        if line:
            sacct_state, _, code = line.partition("|")
            return JobStatus(job_id, sacct_state.split()[0], code)
    return JobStatus(job_id, "UNKNOWN")


def wait_for_state(job_id: str, timeout_s: float, poll_s: float = 0.5) -> JobStatus:
    """Poll until the job is in a final state (or `timeout_s` passes); returns the last status."""
    deadline = time.monotonic() + timeout_s
    status = job_status(job_id)
    while not status.finished and time.monotonic() < deadline:
        time.sleep(poll_s)
        status = job_status(job_id)
    return status


def cancel(job_id: str, wait_s: float = 120.0) -> JobStatus:
    """`scancel JOB`, then wait until Slurm reports a final state (its steps are gone by then)."""
    _run(["scancel", check_job_id(job_id)])
    return wait_for_state(job_id, wait_s)


def log_files(job_id: str, search_root: Path = Path("runs")) -> list[Path]:
    """The job's output file, then its Ray and step logs in `<run_dir>/slurm/<job_id>/`.

    The output path comes from `scontrol`; for jobs Slurm has forgotten, `search_root` is searched
    for `*/slurm/slurm-<job_id>.out`.
    """
    check_job_id(job_id)
    out = _scontrol_fields(job_id).get("StdOut", "")
    candidates = [Path(out)] if out else sorted(search_root.glob(f"*/slurm/slurm-{job_id}.out"))
    files = [p for p in candidates if p.is_file()]
    for main in list(files):
        files += sorted(p for p in (main.parent / job_id).glob("*.log") if p.is_file())
    return files
