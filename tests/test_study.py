"""The study's statistics and run summaries (interval maths against known cases)."""

from __future__ import annotations

import json
import math

import pytest

from nemo_fp8_rl.study import analysis, endpoints, report
from nemo_fp8_rl.study.grid import RunSpec, finished


def test_t_interval_of_identical_values_is_a_point_and_one_seed_has_no_interval():
    iv = analysis.mean_interval([0.4, 0.4, 0.4])
    assert iv.n == 3 and (iv.mean, iv.low, iv.high) == pytest.approx((0.4, 0.4, 0.4))
    assert iv.fmt() == "0.400 [0.400, 0.400] (n=3)"
    one = analysis.mean_interval([0.7])
    assert one.n == 1 and math.isnan(one.low) and one.fmt() == "0.700 (n=1)"
    assert analysis.mean_interval([math.nan]).n == 0


def test_t_interval_of_three_values_by_hand():
    # mean 3, s = √7, t(0.975, 2) = 4.3027: 3 ± 4.3027·√7/√3
    iv = analysis.mean_interval([1.0, 2.0, 6.0])
    half = 4.302652729749464 * math.sqrt(7.0) / math.sqrt(3.0)
    assert (iv.low, iv.high) == pytest.approx((3.0 - half, 3.0 + half))
    assert iv.low < 1.0 and iv.high > 6.0  # wider than the values: 3 seeds say little


def test_paired_statistics_use_common_seeds_only():
    a, b = {1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.4, 2: 0.5, 3: 0.6, 4: 0.0}
    d = analysis.paired(a, b, "diff")
    assert d.n == 3 and d.mean == pytest.approx(0.1) and d.low == pytest.approx(0.1)
    assert d.method == "paired t"
    # quotients of shares: geometric mean of the per-seed quotients (4 and 1 -> 2)
    r = analysis.paired({1: 4.0, 2: 1.0}, {1: 1.0, 2: 1.0}, "ratio")
    assert r.mean == pytest.approx(2.0) and r.n == 2 and r.low < 2.0 < r.high


def _write_run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_of_a_run(tmp_path):
    rows = [{"step": 0, "validation/accuracy": 0.3, "warmup/steps": 310.0}]
    for k in range(1, 7):
        row = {"step": k, "train/entropy": 0.5, "train/clip_lower_frac_neg": 0.01 * k}
        if k % 2:
            row |= {"train/prob_nmae": 0.01, "train/ratio_nmae": 0.02 + 0.01 * (k == 5)}
            row |= {"train/single_pass_nmae": 0.02}
            row |= {"train/fp8_nominal_lower_frac_neg": 0.04, "train/bf16_lower_frac_neg": 0.01}
        if k % 2 == 0:
            row["validation/accuracy"] = 0.4 + 0.1 * k
        rows.append(row)
    _write_run(tmp_path / "r", rows)
    s = analysis.summarize(tmp_path / "r")
    assert s["ratio_amplification"] == pytest.approx(0.07 / 0.03)  # pooled Σ ratio / Σ prob
    assert s["ratio_compounding"] == pytest.approx(0.07 / 0.06)  # Σ ratio / Σ single pass
    assert s["clip_lower_frac_neg"] == pytest.approx(0.035)
    assert s["val_start"] == 0.3 and s["val_tail"] == pytest.approx((0.6 + 0.8 + 1.0) / 3)
    assert s["warmup_steps"] == 310 and s["steps"] == 6 and s["entropy_surges"] == 0
    assert s["shadow_fp8_lower_frac_neg"] / s["shadow_bf16_lower_frac_neg"] == pytest.approx(4)


def test_targets_table_reads_the_roles(tmp_path):
    roles = {"bf16": "b", "fp8_uncal": "u", "fp8_cal": "c"}
    base = {"ratio_amplification": 2.0, "shadow_fp8_lower_frac_neg": 0.02,
            "shadow_bf16_lower_frac_neg": 0.01, "val_start": 0.5, "val_gain": 0.1,
            "entropy_rise": 0.05, "val_scored_bf16": 1.0}  # fmt: skip
    table = {
        "b": {s: {**base, "ratio_compounding": 1.0, "clip_lower_frac_neg": 0.01,
                  "val_mean": 0.8 + 0.01 * s} for s in (1, 2, 3)},
        "u": {s: {**base, "ratio_compounding": 1.05 + 0.01 * s, "clip_lower_frac_neg": 0.03,
                  "val_mean": 0.7 + 0.01 * s} for s in (1, 2, 3)},
        "c": {s: {**base, "ratio_compounding": 1.0, "clip_lower_frac_neg": 0.01,
                  "val_mean": 0.8 + 0.01 * s} for s in (1, 2, 3)},
    }  # fmt: skip
    rows = {r["what"].split(",")[0].split(":")[0]: r for r in report.targets(table, roles)}
    comp = rows["compounding"]
    assert comp["interval"].mean == pytest.approx(1.07) and comp["strict"] is True
    assert rows["same"]["point"] is False  # below √2: not independent errors
    clip = rows["FP8-uncalibrated ÷ BF16 run"]
    assert clip["interval"].mean == pytest.approx(3.0) and clip["strict"] is True
    deficit, recovered = report.targets(table, roles)[6:8]
    assert deficit["interval"].mean == pytest.approx(-0.1) and deficit["strict"] is True
    assert recovered["interval"].mean == pytest.approx(0.1) and recovered["strict"] is True
    assert "primary: mean after step 0, BF16-scored" in deficit["what"]
    table["u"][1]["val_scored_bf16"] = 0.0  # one run scored by its rollout engine: said so
    assert "rollout precision" in report.targets(table, roles)[6]["what"]
    text = report.markdown_targets(report.targets(table, roles))
    assert "| compounding: ratio error ÷ single-pass error" in text and "(n=3)" in text


def test_a_run_is_finished_only_at_its_last_step(tmp_path):
    spec = RunSpec(tmp_path / "r.yaml", "r", 1, tmp_path / "run", steps=3)
    assert not finished(spec)
    _write_run(spec.run_dir, [{"step": 0}, {"step": 2}])
    assert not finished(spec)
    (spec.run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3}\n')
    assert finished(spec)


def test_a_failing_run_is_retried_once_then_reported_and_the_others_go_on(tmp_path):
    from nemo_fp8_rl.study.grid import run_all, run_env

    bad = RunSpec(
        tmp_path / "missing.yaml", "missing", 1, tmp_path / "out" / "missing" / "seed-1", 3
    )
    logs: list[str] = []
    results = run_all([bad], jobs=1, log=logs.append, retries=1)
    assert [r.returncode != 0 for r in results] == [True]
    assert any(line.startswith("retry") for line in logs)
    assert any(line.startswith("FAILED") for line in logs)
    assert (tmp_path / "out" / "missing" / "seed-1.failed-1.log").exists()
    assert "missing.yaml" in (tmp_path / "out" / "missing" / "seed-1.log").read_text()
    assert run_env()["RAY_worker_niceness"] in (
        "0",
        __import__("os").environ.get("RAY_worker_niceness"),
    )


def test_pre_registered_endpoints_of_a_run(tmp_path):
    """The endpoints of endpoints.yaml: the BF16 score when logged (the rollout score ignored),
    mean after step 0, gain from step 0, and the entropy's largest rise above the trailing
    20-step minimum with its threshold."""
    entropy = [0.6, 0.5, 0.45, 0.4, 0.42, 0.55, 0.5]  # rise: 0.55 − 0.40 = 0.15 ≥ 0.1
    rows = [{"step": 0, "validation/accuracy": 0.9, "validation/bf16_accuracy": 0.3}]
    for k, e in enumerate(entropy, 1):
        row = {"step": k, "train/entropy": e}
        if k % 3 == 0:
            row |= {"validation/accuracy": 0.9, "validation/bf16_accuracy": 0.3 + 0.1 * k}
        rows.append(row)
    _write_run(tmp_path / "r", rows)
    s = analysis.summarize(tmp_path / "r")
    assert s["val_scored_bf16"] == 1.0 and s["val_start"] == 0.3
    assert s["val_mean"] == pytest.approx((0.6 + 0.9) / 2)
    assert s["val_gain"] == pytest.approx((0.6 + 0.9) / 2 - 0.3)
    assert s["entropy_rise"] == pytest.approx(0.15) and s["entropy_surge"] == 1.0
    ep = endpoints.load()
    assert endpoints.largest_rise(entropy, 2) == pytest.approx(0.15)
    assert endpoints.largest_rise([0.5, 0.4, 0.3], ep.entropy_surge.window) < 0


def test_endpoints_file_is_what_the_report_prints():
    text = endpoints.describe(endpoints.load())
    assert "mean validation accuracy (greedy) over every evaluation after step 0" in text
    assert "previous 20 steps; a surge when it reaches 0.1 nats" in text
