"""Starting (or joining) Ray for a run on one machine that may be busy (both engines).

On a 2-core machine held at load 12 a plain `ray.init` fails again and again, for three reasons
(Ray 2.60; measured with `benchmarks/bench_ray_start.py`), each handled here:

- the raylet waits a fixed 15 s for its two Python agents (dashboard agent, runtime-env agent)
  to write their ports into the session folder, and aborts when one is late; an agent importing
  Ray at 1/8 of a core takes 15-30 s. `_lean_local_node` removes that wait: the runtime-env
  agent gets a free port chosen here (the raylet is passed it), and the three ports the
  dashboard agent reports are written before the raylet starts (-1, "not served", with Ray's
  minimal install, which is what that agent writes itself once it is up). It also leaves out
  what the engine does not use and `ray.init` would wait for: Ray's API server (so `ray list`
  and the dashboard do not work against this Ray; start your own with `ray start --head` and
  set `RAY_ADDRESS` to have them) and the autoscaler monitor;
- `ray.init` gives the raylet 30 s to register with the GCS, hard-coded in `Node.__init__`;
  `_patient_node_lookup` extends it to `RAYLET_WAIT_S` (through Ray's node-info lookup, which
  that loop calls) and stops when it sees the raylet has exited (`RayletExited`). It looks
  between lookups only: with `RAY_raylet_start_wait_time_s` raised, one lookup of Ray's can
  itself block that long (measured: a raylet that aborted at 15 s was noticed after 240 s),
  which is why the agents' ports are handled first, so that the raylet does not abort;
- Ray starts its worker processes at niceness 15, so any other job on the machine starves the
  trainer and rollout actors (minutes to import torch); `RAY_SETTINGS` starts them at the
  caller's priority, and raises Ray's other start-up waits that have a setting.

With a Ray that lacks one of the hooked functions, that part is left as Ray has it. A start that
fails anyway is cleaned up (the processes it left are stopped) and tried again, up to `attempts`
times within `total_s` seconds. While Ray starts, a progress line is printed every `HEARTBEAT_S`
seconds.

`RAY_ADDRESS` (an existing cluster) is checked with a plain TCP connection first: Ray's own
client retries a dead address for minutes without a word. Ctrl-C while Ray starts is held
until `ray.init` returns, then Ray is shut down and `KeyboardInterrupt` raised, so no
half-started Ray is left for Ray's exit hook to trip over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from nemo_fp8_rl.config.user_error import UserError

ATTEMPTS = 5
TOTAL_S = 900.0
HEARTBEAT_S = 15.0
RAYLET_WAIT_S = 240.0
PROBE_S = 10.0
# Ray settings (environment variables Ray reads), each only when not set already: workers at the
# caller's priority (Ray's default niceness 15 lets any other job starve the actors), and the
# start-up waits that have a setting raised for a busy machine: the GCS port (default 30 s), the
# core worker's wait for its raylet (60 s), a worker's registration with the raylet (60 s; the
# actors' workers import torch), and the GCS's health check of the raylet (default: 5 missed
# checks of 10 s; measured at load 25-37 on 2 cores: the node was marked dead mid-setup, the raylet
# exited and NeMo RL's placement groups then found no GPU) raised to 60 misses of 30 s; and the
# raylet's wait for its runtime-env agent (`agent_register_timeout_ms`, 30 s: measured at load
# 36-60, the agent, a Python process importing Ray, was not listening yet, the raylet exited and
# the training process's registration with it failed, "Failed to register worker to Raylet")
# raised to 300 s.
RAY_SETTINGS = {
    "RAY_worker_niceness": "0",
    "RAY_agent_register_timeout_ms": "300000",
    "RAY_health_check_failure_threshold": "60",
    "RAY_health_check_timeout_ms": "30000",
    "RAY_gcs_server_port_wait_time_s": "120",
    "RAY_raylet_start_wait_time_s": "240",
    "RAY_worker_register_timeout_seconds": "300",
}
# The ports the dashboard agent writes into the session folder, which the raylet waits for.
_DASHBOARD_AGENT_PORTS = (
    "metrics_agent_port",
    "metrics_export_port",
    "dashboard_agent_listen_port",
)
# The methods of Ray's `Node` that `_lean_local_node` replaces while a local node starts.
_LEAN_HOOKS = ("__init__", "start_ray_processes", "start_api_server")

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
    num_gpus: int | None = None,
    runtime_env: dict | None = None,
    attempts: int | None = None,
    total_s: float = TOTAL_S,
    echo: Echo = _stderr,
    record: StartRecord | None = None,
) -> bool:
    """Join `RAY_ADDRESS` when set, else start a local Ray (retried; see the module docstring).

    Returns True when this call started Ray (the caller shuts it down at the end). Raises
    `UserError` (runtime, exit 1) when Ray cannot be started or joined, with what to do.
    `attempts` defaults to `NEMO_FP8_RL_RAY_START_ATTEMPTS` or `ATTEMPTS`. `num_gpus` declares
    logical GPUs (NeMo RL's loop on CPU), `runtime_env` is passed to every actor.
    """
    import ray

    if ray.is_initialized():
        return False
    record = record if record is not None else StartRecord()
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        probe_address(address)
        with _progress("joining Ray at " + address, echo), _held_interrupt(echo), _kept_sigterm():
            _init_or_raise(f"RAY_ADDRESS={address}", address=address, log_to_driver=True)
        return False
    for name, value in RAY_SETTINGS.items():
        os.environ.setdefault(name, value)
    tries = attempts or int(os.environ.get("NEMO_FP8_RL_RAY_START_ATTEMPTS", ATTEMPTS))
    deadline = time.monotonic() + total_s
    for k in range(1, max(tries, 1) + 1):
        t0 = time.monotonic()
        load = os.getloadavg()[0]
        what = f"starting Ray (attempt {k} of {tries}, load {load:.1f} on {os.cpu_count()} CPUs)"
        try:
            with (
                _progress(what, echo),
                _held_interrupt(echo),
                _patient_node_lookup(RAYLET_WAIT_S),
                _lean_local_node(),
                _quiet_token_notice(),
                _kept_sigterm(),
            ):
                ray.init(
                    num_cpus=num_cpus,
                    num_gpus=num_gpus,
                    runtime_env=runtime_env,
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


@contextlib.contextmanager
def _kept_sigterm():
    """Keep this process's SIGTERM handler across `ray.init`: Ray's driver installs a native
    one that prints a stack and aborts (exit 134), where the command ends a run as Ctrl-C does."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


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


class RayletExited(Exception):
    """The raylet this process started died before registering (not a RuntimeError, so that
    Ray's own wait loop, which swallows those, lets it through at once)."""


def _raylet_alive() -> bool:
    """True while a raylet started by this process is running (or none can be seen)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover (psutil comes with Ray)
        return True
    try:
        raylets = [c for c in psutil.Process().children(recursive=True) if c.name() == "raylet"]
        return not raylets or any(c.status() != psutil.STATUS_ZOMBIE for c in raylets)
    except psutil.Error:
        return True


@contextlib.contextmanager
def _patient_node_lookup(wait_s: float) -> Iterator[None]:
    """While Ray starts, let its node-info lookup wait up to `wait_s` for the raylet to register
    (instead of failing at once, which Ray's loop turns into a 30 s limit)."""
    try:
        from ray._private import services
    except ImportError:  # pragma: no cover (every Ray this project supports has it)
        yield
        return
    original = getattr(services, "get_node", None)
    if original is None:
        yield
        return
    deadline = time.monotonic() + wait_s

    def patient(*args, **kwargs):
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                if not _raylet_alive():
                    raise RayletExited(
                        "the raylet exited while starting (see raylet.out in Ray's session folder)"
                    ) from None
                time.sleep(0.5)

    services.get_node = patient
    try:
        yield
    finally:
        services.get_node = original


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick; free until someone binds it)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _lean_local_node() -> Iterator[None]:
    """While `ray.init` starts a local node: start only what the engine uses, and let the
    raylet learn its agents' ports without waiting.

    - Ray's API server (the dashboard process that serves `ray list`, jobs and the state API)
      and its autoscaler monitor are not started: the engine uses neither, and `ray.init`
      waits for the API server to come up before it starts the raylet (25 s at load 12);
    - the runtime-env agent gets a free port chosen here, which the raylet is passed;
    - before the node's processes start, the three ports the dashboard agent would report are
      written to the session folder with Ray's own `persist_port`: -1 with Ray's minimal
      install (the agent serves none of them there and writes -1 itself once up); otherwise
      free ports, which the agent is passed.

    Nothing is changed when Ray lacks the functions used.
    """
    try:
        from ray._private import node as node_module
        from ray._private.utils import get_dashboard_dependency_error
        from ray._raylet import persist_port
    except ImportError:  # pragma: no cover (every Ray this project supports has them)
        yield
        return
    Node = node_module.Node  # noqa: N806 (Ray's class)
    originals = {name: getattr(Node, name, None) for name in _LEAN_HOOKS}
    if None in originals.values():  # pragma: no cover (a Ray without these methods)
        yield
        return
    minimal = get_dashboard_dependency_error() is not None

    def init(self, ray_params, *args, **kwargs):
        ray_params.no_monitor = True
        ray_params.update_if_absent(runtime_env_agent_port=free_port())
        if not minimal:
            ray_params.update_if_absent(metrics_agent_port=free_port())
            ray_params.update_if_absent(metrics_export_port=free_port())
            ray_params.dashboard_agent_listen_port = free_port()
        originals["__init__"](self, ray_params, *args, **kwargs)

    def start_ray_processes(self):
        for name in _DASHBOARD_AGENT_PORTS:
            port = -1 if minimal else getattr(self._ray_params, name)
            persist_port(self._session_dir, self._node_id, name, port)
        return originals["start_ray_processes"](self)

    def start_api_server(self, **_):
        self._webui_url = None

    replacements = {
        "__init__": init,
        "start_ray_processes": start_ray_processes,
        "start_api_server": start_api_server,
    }
    for name, function in replacements.items():
        setattr(Node, name, function)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(Node, name, function)


# Ray's notice on every local start that it switched token authentication on by default: the
# local cluster this engine starts is its own (it stays on; the notice says nothing to act on).
TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropTokenNotice(logging.Filter):
    """Drops Ray's token-authentication notice; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(TOKEN_NOTICE)


@contextlib.contextmanager
def _quiet_token_notice() -> Iterator[None]:
    """While a local Ray starts: leave out Ray's token-authentication notice (only that one)."""
    logger, notice = logging.getLogger(_AUTH_LOGGER), _DropTokenNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


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
