"""W&B and MLflow for the embedded engine, switched on by the keys NeMo RL's logger reads.

`logger.wandb_enabled: true` logs every step's metrics to a W&B run named `logger.wandb.name` in
project `logger.wandb.project` (entity, group, tags and notes passed on when set), its files
under `<run dir>/logs/wandb`. As the `wandb` client does when nobody is logged in and no prompt
can be shown, the run is then kept offline (mode `offline`; `wandb sync <folder>` uploads it
later); `WANDB_MODE` (e.g. `offline`, `disabled`) is honoured as W&B honours it.

`logger.mlflow_enabled: true` logs to MLflow: `logger.mlflow.tracking_uri` or
`MLFLOW_TRACKING_URI` when set, else a local file store in `<run dir>/logs/mlflow` (read it
with `mlflow ui --backend-store-uri <that folder>`), experiment `logger.mlflow.experiment_name`,
run `logger.mlflow.run_name`. MLflow 3 keeps its file store in maintenance mode behind
`MLFLOW_ALLOW_FILE_STORE`, which is set for a file store the run uses, this default one or one
the recipe or `MLFLOW_TRACKING_URI` names (`runs.endpoints.mlflow_store`).

SwanLab (`logger.swanlab_enabled`) is refused at load for CPU recipes (`config/rules.py`); on a
GPU recipe NeMo RL's own logger serves all three.
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.runs.endpoints import mlflow_store, wandb_logged_in

_WANDB_KEYS = ("project", "name", "entity", "group", "tags", "notes", "job_type")
_PACKAGES = {"wandb_enabled": ("wandb", "W&B"), "mlflow_enabled": ("mlflow", "MLflow")}


class Sink(Protocol):
    """A metrics backend: one call per step, then close."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def check_available(config: dict) -> None:
    """Refuse, before anything starts, a backend that is switched on but not installed."""
    logger = config.get("logger", {})
    for key, (package, label) in _PACKAGES.items():
        if logger.get(key) and importlib.util.find_spec(package) is None:
            raise UserError(
                f"logger.{key}",
                f"{label} logging is on but the {package} package is not installed here",
                f"install it (pip install 'nemo-fp8-rl[logging]', or pip install {package}), "
                f"or set logger.{key}=false",
            )


def open_sinks(config: dict, run_dir: Path) -> list[Sink]:
    """The backends the recipe switches on (none: an empty list)."""
    logger = config.get("logger", {})
    sinks: list[Sink] = []
    if logger.get("wandb_enabled"):
        sinks.append(WandbSink(logger.get("wandb") or {}, run_dir / "logs"))
    if logger.get("mlflow_enabled"):
        sinks.append(MlflowSink(logger.get("mlflow") or {}, run_dir / "logs"))
    return sinks


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


class WandbSink:
    """A W&B run in `<log_dir>/wandb`; offline when nobody is logged in (see the module)."""

    def __init__(self, cfg: dict[str, Any], log_dir: Path) -> None:
        import wandb

        folder = log_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or ("online" if wandb_logged_in() else "offline")
        kwargs = {k: cfg[k] for k in _WANDB_KEYS if cfg.get(k) is not None}
        self.run = wandb.init(dir=str(folder), mode=mode, reinit="finish_previous", **kwargs)
        if mode == "offline":
            print(
                f"W&B: no login found (WANDB_API_KEY or `wandb login`), so the run is logged "
                f"offline in {folder}; upload it later with `wandb sync {folder}/offline-run-*`",
                flush=True,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(_finite(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run; a file store in `<log_dir>/mlflow` unless a tracking URI is set."""

    def __init__(self, cfg: dict[str, Any], log_dir: Path) -> None:
        uri = cfg.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:  # a file store named by the recipe or the environment is allowed too
            mlflow_store("MLflow tracking URI", str(uri))
        else:
            folder = (log_dir / "mlflow").resolve()
            folder.mkdir(parents=True, exist_ok=True)
            uri = folder.as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri=uri)
        name = cfg.get("experiment_name") or "Default"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        run = self.client.create_run(experiment_id, run_name=cfg.get("run_name"))
        self.run_id = run.info.run_id
        self.uri = uri

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in _finite(metrics).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
