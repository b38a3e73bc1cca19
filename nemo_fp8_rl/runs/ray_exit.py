"""A training process that Ray ends while it registers with its raylet: located, then retried.

On a busy machine (measured: load 37-53 on 2 cores) `ray.init` in the training process can end
it from Ray's C++ core worker: "core_worker_process.cc: Failed to register worker to Raylet:
IOError: Failed to read data from the socket: End of file", exit 1, no Python exception, so
nothing in the process can say where it stopped or try again. `supervise` therefore runs the
training command as a child process (stdout shared, stderr passed through line by line): when
the child exits non-zero and its stderr holds that line, it prints a located error (what
happened, the load, the attempt) and runs the same command again, up to `attempts` times. It
happens inside `ray.init`, before any step, so the same command line is the right one to repeat
(with `--resume` too: nothing was written since the last checkpoint). Any other exit is
returned as it is.

The child dies with the parent (`PR_SET_PDEATHSIG` on Linux), and SIGINT, SIGTERM and SIGHUP
sent to the parent are passed to the child, so killing or interrupting `nemo_fp8_rl.train`
acts on the training process as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

from nemo_fp8_rl.config.user_error import render

CHILD = "NEMO_FP8_RL_SUPERVISED"  # set in the child: it trains, it does not supervise again
MARK = "Failed to register worker to Raylet"
ATTEMPTS = 3
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1

Echo = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def is_child() -> bool:
    """True inside the supervised training process."""
    return os.environ.get(CHILD) == "1"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen) -> Iterator[None]:
    """Signals sent to this process go to the child while it runs."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_once(command: list[str]) -> tuple[int, bool]:
    """Run `command` as the supervised child; its exit code and whether Ray's registration
    failure appeared on its stderr (passed through as it comes)."""
    proc = subprocess.Popen(
        command, env={**os.environ, CHILD: "1"}, stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads yet in this process)
    )  # fmt: skip
    seen = False
    out = getattr(sys.stderr, "buffer", None)
    with _forwarding(proc):
        assert proc.stderr is not None
        for line in proc.stderr:
            seen = seen or MARK.encode() in line
            if out is not None:
                out.write(line)
                out.flush()
            else:
                sys.stderr.write(line.decode(errors="replace"))
        return proc.wait(), seen


def located(code: int, attempt: int, attempts: int) -> str:
    """The error line for a training process Ray ended while registering with its raylet."""
    load = os.getloadavg()[0]
    head = (
        f"error: ray.init in the training process: Ray ended it while it registered with its "
        f"raylet ('{MARK}', exit {code}) at load {load:.1f} on {os.cpu_count()} CPUs: the "
        "raylet did not answer in time on a busy machine; nothing was trained in that attempt."
    )
    if attempt < attempts:
        return f"{head} Retrying the same command (attempt {attempt + 1} of {attempts})."
    return render(
        "",
        f"{head} Gave up after {attempts} attempts",
        "run again when the machine is less busy (see `uptime`), or set "
        "NEMO_FP8_RL_RAY_REGISTER_ATTEMPTS higher",
    )


def supervise(command: list[str], attempts: int | None = None, echo: Echo = _stderr) -> int:
    """Run the training `command` until it ends other than by Ray's registration failure (at
    most `attempts` times: `NEMO_FP8_RL_RAY_REGISTER_ATTEMPTS` or `ATTEMPTS`); its exit code."""
    tries = attempts or int(os.environ.get("NEMO_FP8_RL_RAY_REGISTER_ATTEMPTS", ATTEMPTS))
    code = 0
    for attempt in range(1, max(tries, 1) + 1):
        code, registration_failed = run_once(command)
        if code == 0 or not registration_failed:
            return code
        echo(located(code, attempt, tries))
    return code
