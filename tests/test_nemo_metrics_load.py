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


def test_each_train_step_carries_the_load_average_and_nemo_rl_gets_its_metrics_unchanged(
    tmp_path: Path,
) -> None:
    logger = RecordingLogger()
    tee = MetricsTee(logger, tmp_path / "metrics.jsonl")
    tee.log_metrics({"accuracy": 0.5}, 0, "validation")
    tee.log_metrics({"loss": 0.5}, 3, "train")
    tee.log_metrics({"accuracy": 0.25}, 3, "validation", step_finished=True)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "validation/accuracy": 0.5}  # no train metrics: no load
    assert rows[1]["train/loss"] == 0.5 and rows[1][LOAD_AVERAGE] >= 0.0
    assert rows[1]["validation/accuracy"] == 0.25
    assert logger.calls == [
        ({"accuracy": 0.5}, 0, "validation"),
        ({"loss": 0.5}, 3, "train"),
        ({"accuracy": 0.25}, 3, "validation"),
    ]
