"""Which NeMo RL the engine accepts, decided from the source; and the metrics.jsonl tee."""

from __future__ import annotations

import importlib.util
import json
import math
import textwrap

import pytest
import torch

from nemo_fp8_rl.analysis.rundata import read_jsonl
from nemo_fp8_rl.engines.nemo.driver import compat
from nemo_fp8_rl.engines.nemo.driver.metrics_log import MetricsTee, flatten_metrics

NO_NEMO_RL = importlib.util.find_spec("nemo_rl") is None


@pytest.mark.skipif(not NO_NEMO_RL, reason="nemo_rl is importable here")
def test_unavailable_says_what_is_missing_and_how_to_install() -> None:
    ok, why = compat.available()
    assert not ok
    assert "NeMo RL is not importable" in why and "v0.7.0" in why and "docs/cluster.md" in why
    with pytest.raises(RuntimeError, match="not importable"):
        compat.require_supported()


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# Interface skeletons as they appear in NeMo RL v0.6.0 and v0.7.0 (names and signatures only).
_V06 = {
    "algorithms/loss/loss_functions.py": "class ClippedPGLossFn: ...\n",
    "algorithms/grpo.py": """
        class MasterConfig(TypedDict): ...
        def setup(master_config, tokenizer, dataset, val_dataset, processor=None): ...
        def grpo_train(policy, policy_generation): ...
        """,
    "models/policy/lm_policy.py": """
        class Policy:
            def __init__(self, cluster, config, worker_extension_cls_fqn=None): ...
        """,
}
_V07 = dict(
    _V06,
    **{
        "algorithms/grpo.py": """
        class MasterConfig(BaseModel, extra="allow"): ...
        def setup(master_config, tokenizer, dataset, val_dataset, processor=None, policy_factory=None): ...
        def grpo_train(policy, policy_generation): ...
        """
    },
)


def test_source_checks_accept_v07_interfaces_and_name_what_v06_lacks(tmp_path) -> None:
    _write(tmp_path / "v07", _V07)
    _write(tmp_path / "v06", _V06)
    assert compat.missing_features(tmp_path / "v07") == []
    assert compat.missing_features(tmp_path / "v06") == [
        "pydantic MasterConfig (v0.7.0+)",
        "grpo.setup(policy_factory=...) (v0.7.0+)",
    ]
    assert len(compat.missing_features(tmp_path / "empty")) == 5


def test_info_describes_support() -> None:
    info = compat.NemoRLInfo("0.6.0", "/x", ("pydantic MasterConfig (v0.7.0+)",))
    assert not info.supported and "lacks: pydantic MasterConfig" in info.describe()
    assert compat.NemoRLInfo("0.7.0", "/x").supported


class _RecordingLogger:
    """Stand-in for NeMo RL's Logger (its backends need wandb/tensorboard set up)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_metrics(self, metrics, step, prefix="", step_metric=None, step_finished=False):
        self.calls.append((dict(metrics), step, prefix))

    def log_hyperparams(self, params):
        return "passed through"


def test_metrics_tee_writes_nemo_rl_names_one_row_per_step(tmp_path) -> None:
    inner = _RecordingLogger()
    tee = MetricsTee(inner, tmp_path / "metrics.jsonl")
    tee.log_metrics(
        {"loss": 0.5, "calib_low": torch.tensor(0.8), "text": "x", "arr": [1, 2]}, 3, prefix="train"
    )
    tee.log_metrics(
        {"total_step_time": 2.0, "nan": math.nan}, 3, prefix="timing/train", step_finished=True
    )
    tee.log_metrics({"accuracy": 0.25}, 4, "validation")
    tee.finish()
    assert len(inner.calls) == 3 and inner.calls[0][2] == "train"
    assert tee.log_hyperparams({}) == "passed through"
    rows, notes = read_jsonl(tmp_path / "metrics.jsonl")
    assert notes == []
    assert rows[3]["train/loss"] == 0.5 and rows[3]["train/calib_low"] == pytest.approx(0.8)
    assert "train/text" not in rows[3] and "train/arr" not in rows[3]
    assert rows[3]["timing/train/total_step_time"] == 2.0 and math.isnan(
        rows[3]["timing/train/nan"]
    )
    assert rows[4] == {"validation/accuracy": 0.25}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [3, 4]  # a row per step


def test_flatten_nested_metrics() -> None:
    assert flatten_metrics({"a": {"b": 1, "c": {"d": 2.5}}}, "train") == {
        "train/a/b": 1.0,
        "train/a/c/d": 2.5,
    }
