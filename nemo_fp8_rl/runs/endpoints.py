"""The logging endpoints a run will talk to, probed before anything starts (as `RAY_ADDRESS` is).

A run with MLflow logging to a tracking server that is down would otherwise start Ray, warm up
and train its first step before MLflow's client gives up, minutes later, with a traceback. Here
an `http(s)://` tracking URI (`logger.mlflow.tracking_uri`, else `MLFLOW_TRACKING_URI`) and,
for a W&B run that will log online (`WANDB_MODE=online`, or a login without `WANDB_MODE`), the
W&B host (`WANDB_BASE_URL`, default api.wandb.ai) must accept a TCP connection within
`PROBE_S` seconds; otherwise the run is refused with the address and how to fix it. Offline
W&B runs need no server and are not probed.

An MLflow tracking URI is read as MLflow reads it before anything starts (`mlflow_store`): a
malformed one (`http://` without a host, a scheme MLflow has no store for) is refused with
what MLflow accepts; a file store (`file:///path`, or a plain path), wherever the URI comes
from, must be a folder (or creatable) and is allowed through `MLFLOW_ALLOW_FILE_STORE` (MLflow
3 refuses its file store without it, which before this check surfaced minutes into a run,
after Ray and the warm-up).
"""

from __future__ import annotations

import netrc
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from nemo_fp8_rl.config.mlflow_uri import FIX, file_store_folder, store_kind
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


def mlflow_store(where: str, uri: str) -> str:
    """The kind of MLflow store `uri` names (`config.mlflow_uri.store_kind`), or a `UserError`
    at `where`; a file store must be a folder (or not exist yet) and gets
    `MLFLOW_ALLOW_FILE_STORE=true` (see the module docstring)."""
    kind, problem = store_kind(uri)
    if kind is None:
        raise UserError(where, str(problem), FIX)
    if kind == "file":
        folder = Path(file_store_folder(uri)).expanduser()
        if folder.exists() and not folder.is_dir():
            raise UserError(where, f"{folder} is a file, not the store's folder", FIX)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return kind


def probe_loggers(config: dict, timeout_s: float = PROBE_S) -> None:
    """Refuse a run whose MLflow URI is malformed, whose MLflow server or (online) W&B host
    does not answer (module doc)."""
    logger = config.get("logger") or {}
    if logger.get("mlflow_enabled"):
        cfg = logger.get("mlflow") or {}
        key = "logger.mlflow.tracking_uri" if cfg.get("tracking_uri") else "MLFLOW_TRACKING_URI"
        uri = str(cfg.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "")
        where = f"MLflow ({key}={uri})"
        if uri and mlflow_store(where, uri) == "http":
            _probe(
                where,
                uri,
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
