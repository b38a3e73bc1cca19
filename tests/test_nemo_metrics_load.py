"""The NeMo engine's metrics.jsonl records the machine's load average with each training step."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_fp8_rl.engines.nemo.driver.metrics_log import LOAD_AVERAGE, MetricsTee


class RecordingLogger:
    """Records what NeMo RL's `Logger.log_metrics` would receive (its backends are not needed)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_metrics(self, metrics, step, prefix="", *args, **kwargs) -> None:
        self.calls.append((dict(metrics), step, prefix))


def test_each_train_line_carries_the_load_average_and_nemo_rl_gets_its_metrics_unchanged(
    tmp_path: Path,
) -> None:
    logger = RecordingLogger()
    tee = MetricsTee(logger, tmp_path / "metrics.jsonl")
    tee.log_metrics({"loss": 0.5}, 3, "train")
    tee.log_metrics({"accuracy": 0.25}, 3, "validation")
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/loss"] == 0.5 and rows[0][LOAD_AVERAGE] >= 0.0
    assert LOAD_AVERAGE not in rows[1]
    assert logger.calls == [({"loss": 0.5}, 3, "train"), ({"accuracy": 0.25}, 3, "validation")]
