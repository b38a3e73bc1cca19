"""An MLflow tracking URI read as MLflow reads it: which store it names, or why it names none.

`store_kind` is pure (no environment, no network): `http` (a tracking server), `file` (a local
file store: `file:///folder`, `file:folder` or a plain path), `db` (MLflow's SQLAlchemy stores)
or `remote` (Databricks); a URI that is not valid, an `http(s)://` URI without a host, a file
URI on another host, or a scheme MLflow has no tracking store for is a problem. Checked at load
for `logger.mlflow.tracking_uri` (`config.rules`) and again before a run starts for the URI the
run will use, which may come from `MLFLOW_TRACKING_URI` (`runs.endpoints`).
"""

from __future__ import annotations

from urllib.parse import urlparse

DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
REMOTE_SCHEMES = ("databricks", "databricks-uc", "uc")
FIX = (
    "set it to http(s)://HOST:PORT of a tracking server, file:///absolute/folder or a folder "
    "path, sqlite:///file.db, or databricks; or set logger.mlflow_enabled=false"
)


def store_kind(uri: str) -> tuple[str | None, str | None]:
    """(kind, None) for a URI MLflow can use, (None, what is wrong) otherwise."""
    try:
        parsed = urlparse(uri)
        parsed.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return None, f"{uri!r} is not a valid URI ({exc})"
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return ("http", None) if parsed.hostname else (None, f"{uri!r} names no host")
    if scheme in ("", "file"):
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            return None, f"{uri!r} is a file URI on another host ({parsed.netloc})"
        return "file", None
    if scheme.split("+")[0] in DB_SCHEMES:
        return "db", None
    if scheme in REMOTE_SCHEMES:
        return "remote", None
    return None, f"{uri!r}: MLflow has no tracking store for the scheme {scheme!r}"


def file_store_folder(uri: str) -> str:
    """The folder a `file` store URI names (`file:///x` -> `/x`; a plain path as it is)."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme.lower() == "file" else uri
