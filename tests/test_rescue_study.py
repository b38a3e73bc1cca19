"""The rescue study's statistics (study/significance), comparisons (study/rescue_report) and the
reproducibility check (study/rescue): each rule on values whose answer is known."""

from __future__ import annotations

import math

import pytest

from nemo_fp8_rl.study import rescue, rescue_report
from nemo_fp8_rl.study.significance import holm, paired_test


def test_paired_test_matches_a_hand_computed_t_test():
    # d = 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 3.4641 with 2 df: two-sided p = 0.07418
    iv, p = paired_test({1: 1.0, 2: 2.0, 3: 3.0})
    assert iv.estimate == 2.0 and iv.n == 3
    assert p == pytest.approx(0.0741799, abs=1e-6)
    assert iv.low == pytest.approx(2.0 - 4.302653 / math.sqrt(3), abs=1e-5)


def test_paired_test_edge_cases():
    assert math.isnan(paired_test({1: 0.5})[1])
    assert paired_test({1: 0.5, 2: 0.5})[1] == 0.0
    assert paired_test({1: 0.0, 2: 0.0})[1] == 1.0


def test_holm_step_down_in_the_given_order():
    # sorted 0.01, 0.02, 0.04 -> 0.03, 0.04, max(0.04, 0.04) = 0.04; NaN kept out of m
    assert holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04],
                                                               nan_ok=True)  # fmt: skip
    assert holm([0.5, 0.6]) == [1.0, 1.0]


def _table(values: dict[str, list[float]]) -> dict[str, dict[int, dict]]:
    return {arm: {s + 1: {"val_gain": v} for s, v in enumerate(vs)} for arm, vs in values.items()}


def test_comparisons_follow_the_preregistered_formulas():
    table = _table(
        {
            "bf16": [0.10, 0.12, 0.11],
            "bf16-noclip": [0.11, 0.12, 0.13],
            "nvfp4-uncalibrated": [0.05, 0.08, 0.06],
            "nvfp4-noclip": [0.09, 0.11, 0.10],
            "nvfp4-unfloored": [0.05, 0.09, 0.06],
        }
    )
    comps = {c.name: c for c in rescue_report.comparisons(table)}
    assert comps["control"].interval.estimate == pytest.approx(0.01)
    assert comps["ceiling[nvfp4]"].interval.estimate == pytest.approx(0.0366667, abs=1e-6)
    assert comps["mediation[nvfp4]"].interval.estimate == pytest.approx(0.0266667, abs=1e-6)
    assert comps["noclip_loss[nvfp4]"].interval.estimate == pytest.approx(-0.02)
    family = [c for c in comps.values() if c.family]
    assert {c.name for c in family} == {"mediation[nvfp4]", "unfloored[nvfp4]"}
    assert all(c.holm_p >= c.p for c in family)
    assert not comps["control"].family and math.isnan(comps["control"].holm_p)


def test_reproduce_differences_ignore_timing_and_events_only():
    old = [{"step": 1, "train/loss": 0.5, "timing/train/total_step_time": 3.0,
            "system/load_average_1min": 2.0}]  # fmt: skip
    same = [{"step": 1, "train/loss": 0.5, "timing/train/total_step_time": 9.0,
             "system/load_average_1min": 30.0}, {"step": 1, "event": {"kind": "health"}}]  # fmt: skip
    assert rescue.reproduce_differences(same, old) == []
    moved = [{"step": 1, "train/loss": 0.5000001}]
    assert rescue.reproduce_differences(moved, old) == ["step 1 train/loss: 0.5000001 != 0.5"]
    nan = [{"step": 1, "train/loss": math.nan}]
    assert rescue.reproduce_differences(nan, [{"step": 1, "train/loss": math.nan}]) == []


def test_every_arm_of_the_design_has_its_recipe():
    paths = rescue.recipe_paths(rescue_report.arms())
    assert len(paths) == len(set(paths)) == 12
