"""The logging endpoints a run will talk to, probed before anything starts (as `RAY_ADDRESS` is).

A run with MLflow logging to a tracking server that is down would otherwise start Ray, warm up
and train its first step before MLflow's client gives up, minutes later, with a traceback. Here
an `http(s)://` tracking URI (`logger.mlflow.tracking_uri`, else `MLFLOW_TRACKING_URI`) and,
for a W&B run that will log online (`WANDB_MODE=online`, or a login without `WANDB_MODE`), the
W&B host (`WANDB_BASE_URL`, default api.wandb.ai) must accept a TCP connection within
`PROBE_S` seconds; otherwise the run is refused with the address and how to fix it. File
stores and offline W&B runs need no server and are not probed.
"""

from __future__ import annotations

import netrc
import os
import socket
from urllib.parse import urlparse

from nemo_fp8_rl.config.user_error import UserError

PROBE_S = 5.0


def wandb_logged_in() -> bool:
    """True when W&B has credentials: `WANDB_API_KEY`, or a ~/.netrc (`NETRC`) entry for the
    W&B host (`WANDB_BASE_URL`, default api.wandb.ai), which is where `wandb login` saves it."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _probe(where: str, uri: str, fix: str, timeout_s: float) -> None:
    """Refuse an http(s) `uri` whose host accepts no TCP connection within `timeout_s`."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        raise UserError(where, f"{uri!r} has no valid port", fix) from None
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise UserError(
            where,
            f"nothing answers at {parsed.hostname}:{port} "
            f"({exc.strerror or type(exc).__name__}); nothing was started",
            fix,
        ) from None


def probe_loggers(config: dict, timeout_s: float = PROBE_S) -> None:
    """Refuse a run whose MLflow server or (online) W&B host does not answer (module doc)."""
    logger = config.get("logger") or {}
    if logger.get("mlflow_enabled"):
        cfg = logger.get("mlflow") or {}
        key = "logger.mlflow.tracking_uri" if cfg.get("tracking_uri") else "MLFLOW_TRACKING_URI"
        uri = cfg.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or ""
        _probe(
            f"MLflow ({key}={uri})",
            str(uri),
            "start the MLflow tracking server, point the URI at a running one, or set "
            "logger.mlflow_enabled=false",
            timeout_s,
        )
    mode = os.environ.get("WANDB_MODE") or ("online" if wandb_logged_in() else "offline")
    if logger.get("wandb_enabled") and mode == "online":
        base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        _probe(
            f"W&B ({base})",
            base,
            "check the network (or WANDB_BASE_URL), log offline with WANDB_MODE=offline, or set "
            "logger.wandb_enabled=false",
            timeout_s,
        )
