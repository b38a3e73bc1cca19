"""Starting (or joining) Ray for the embedded engine, on a machine that may be busy.

`ray.init` on a new local cluster gives up when the raylet has not registered with the GCS
within 30 s, a wait Ray hard-codes. On a loaded 2-core machine the raylet and the Python agents
it starts can take longer than that, so a start that times out is cleaned up (the processes it
left are stopped) and tried again, up to `attempts` times within `total_s` seconds; the GCS port
wait, which Ray does let us set (`RAY_gcs_server_port_wait_time_s`), is raised from 30 s to
`GCS_PORT_WAIT_S`. While Ray starts, a progress line is printed every `HEARTBEAT_S` seconds.

`RAY_ADDRESS` (an existing cluster) is checked with a plain TCP connection first: Ray's own
client retries a dead address for minutes without a word. Ctrl-C while Ray starts is held
until `ray.init` returns, then Ray is shut down and `KeyboardInterrupt` raised, so no
half-started Ray is left for Ray's exit hook to trip over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from nemo_fp8_rl.config.user_error import UserError

ATTEMPTS = 4
TOTAL_S = 420.0
HEARTBEAT_S = 15.0
GCS_PORT_WAIT_S = 120
PROBE_S = 10.0

Echo = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class StartRecord:
    """How a start went: seconds per attempt and the error of each failed one."""

    attempts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(self.attempts)


def start_ray(
    num_cpus: int = 2,
    *,
    attempts: int | None = None,
    total_s: float = TOTAL_S,
    echo: Echo = _stderr,
    record: StartRecord | None = None,
) -> bool:
    """Join `RAY_ADDRESS` when set, else start a local Ray (retried; see the module docstring).

    Returns True when this call started Ray (the caller shuts it down at the end). Raises
    `UserError` (runtime, exit 1) when Ray cannot be started or joined, with what to do.
    `attempts` defaults to `NEMO_FP8_RL_RAY_START_ATTEMPTS` or `ATTEMPTS`.
    """
    import ray

    if ray.is_initialized():
        return False
    record = record if record is not None else StartRecord()
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        probe_address(address)
        with _progress("joining Ray at " + address, echo), _held_interrupt(echo):
            _init_or_raise(f"RAY_ADDRESS={address}", address=address, log_to_driver=True)
        return False
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_PORT_WAIT_S))
    tries = attempts or int(os.environ.get("NEMO_FP8_RL_RAY_START_ATTEMPTS", ATTEMPTS))
    deadline = time.monotonic() + total_s
    for k in range(1, max(tries, 1) + 1):
        t0 = time.monotonic()
        load = os.getloadavg()[0]
        what = f"starting Ray (attempt {k} of {tries}, load {load:.1f} on {os.cpu_count()} CPUs)"
        try:
            with _progress(what, echo), _held_interrupt(echo):
                ray.init(
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=True,
                    configure_logging=False,
                )
            record.attempts.append(time.monotonic() - t0)
            return True
        except Exception as exc:  # noqa: BLE001 (Ray raises plain Exceptions on start-up failures)
            record.attempts.append(time.monotonic() - t0)
            record.errors.append(_first_line(exc))
            stop_partial_start()
            last = k == tries or time.monotonic() > deadline
            if last:
                raise _start_error(exc, k) from exc
            echo(
                f"Ray did not start in {time.monotonic() - t0:.0f} s ({_first_line(exc)}); retrying"
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _start_error(exc: BaseException, tries: int) -> UserError:
    return UserError(
        "Ray (local cluster)",
        f"could not start Ray in {tries} attempt(s): {_first_line(exc)}",
        "run the same command again when the machine is less loaded (a run that never reached "
        "its first step starts over by itself; one with checkpoints continues with --resume), "
        "and check free space in /tmp (Ray's session folder)",
    )


def _init_or_raise(where: str, **kwargs) -> None:
    """`ray.init(**kwargs)`, its failures reported as a `UserError` located at `where`."""
    import ray

    try:
        ray.init(**kwargs)
    except Exception as exc:  # noqa: BLE001 (see start_ray)
        stop_partial_start()
        raise UserError(
            f"Ray ({where})",
            f"could not join Ray: {_first_line(exc)}",
            "check that RAY_ADDRESS names a running cluster (`ray status`), or unset it to "
            "start a local Ray",
        ) from exc


def probe_address(address: str, timeout_s: float = PROBE_S) -> None:
    """Refuse a `RAY_ADDRESS` nothing listens at (TCP connect within `timeout_s`).

    `auto` and `local` are Ray's own names for the cluster on this machine; they are left to
    Ray. `ray://host:port` (Ray client) and `host:port` are probed.
    """
    text = address.removeprefix("ray://")
    if text in ("auto", "local") or ":" not in text:
        return
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise UserError(
            f"Ray (RAY_ADDRESS={address})",
            f"{port!r} is not a port number",
            "set RAY_ADDRESS to host:port of a running cluster (e.g. 10.0.0.1:6379), or unset it",
        ) from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(
                (host, number), timeout=max(deadline - time.monotonic(), 0.5)
            ):
                return
        except OSError as exc:
            if time.monotonic() >= deadline or isinstance(exc, ConnectionRefusedError):
                raise UserError(
                    f"Ray (RAY_ADDRESS={address})",
                    f"nothing answers at {host}:{number} ({exc.strerror or type(exc).__name__})",
                    "start the cluster there (`ray start --head`), fix RAY_ADDRESS, or unset "
                    "it to start a local Ray",
                ) from None
            time.sleep(0.5)


def stop_partial_start() -> None:
    """After a failed `ray.init`: reset Ray's driver state and stop the Ray processes this
    process started (GCS, raylet, agents, reaper), which Ray leaves running when its
    start-up times out."""
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
    try:
        import psutil
    except ImportError:  # pragma: no cover (psutil comes with Ray)
        return
    ray_dir = os.path.dirname(ray.__file__)
    procs = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any(ray_dir in part for part in child.cmdline()):
                    procs.append(child)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@contextlib.contextmanager
def _progress(what: str, echo: Echo) -> Iterator[None]:
    """Print `what...` now and `... still waiting (N s)` every `HEARTBEAT_S` until done."""
    echo(what + " ...")
    done = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            echo(f"  ... still waiting for Ray ({time.monotonic() - t0:.0f} s)")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1)


@contextlib.contextmanager
def _held_interrupt(echo: Echo) -> Iterator[None]:
    """Hold SIGINT while Ray starts; on exit, if one came, shut Ray down and raise
    KeyboardInterrupt. A second Ctrl-C raises at once (after stopping what was started)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def handler(signum, frame):
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)
        echo("interrupted: stopping once Ray's start-up returns (Ctrl-C again to stop now)")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    except KeyboardInterrupt:
        stop_partial_start()
        raise
    except Exception:
        if not pending:
            raise
        stop_partial_start()
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        stop_partial_start()
        raise KeyboardInterrupt
