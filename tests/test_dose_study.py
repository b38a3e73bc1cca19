"""The precision dose study's design code: arms, the pre-registered surge threshold rule, and the
tables over archived runs (a docs test regenerates the committed tables once runs are archived)."""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from nemo_fp8_rl.study import dose, dose_report, endpoints


def test_design_is_read_from_the_endpoints_file():
    d = endpoints.load().dose
    assert d.formats == ["fp8-block", "mxfp8", "nvfp4", "mxfp4"] and d.steps == 150
    assert d.run_order[:3] == ["bf16", "fp8-block", "nvfp4"]
    assert dose.arms(["bf16", "nvfp4"]) == [
        "grpo-dose-bf16", "grpo-dose-nvfp4-uncalibrated", "grpo-dose-nvfp4"
    ]  # fmt: skip
    for arm in dose.arms(["bf16", *d.formats]):
        assert (dose.RECIPES / f"{arm}.yaml").is_file()
    with pytest.raises(ValueError, match="unknown dose format 'fp6'"):
        dose.arms(["fp6"])


def test_surge_threshold_is_mean_plus_two_sample_sd():
    rises = [0.02, 0.05, 0.03, 0.04, 0.06]
    expect = statistics.fmean(rises) + 2 * statistics.stdev(rises)
    assert dose.surge_threshold(rises) == pytest.approx(expect)
    with pytest.raises(ValueError, match=">= 2 finished BF16 runs"):
        dose.surge_threshold([0.1])


def _run(folder, seed, gain, dose_value, clip):
    """An archived run: step-0 and later validations, training steps with shadow metrics."""
    d = folder / f"seed-{seed}"
    d.mkdir(parents=True)
    recs = [{"step": 0, "validation/bf16_accuracy": 0.4}]
    for step in range(1, 31):
        rec = {"step": step, "train/entropy": 0.7, "train/clip_lower_frac_neg": clip,
               "train/clip_upper_frac_pos": clip / 2}  # fmt: skip
        if step % 5 == 0 and dose_value > 0:  # BF16 runs have no shadow pass
            rec.update({"train/prob_nmae": dose_value / 2, "train/ratio_nmae": dose_value,
                        "train/single_pass_nmae": dose_value})  # fmt: skip
        if step % 10 == 0:
            rec["validation/bf16_accuracy"] = 0.4 + gain
        recs.append(rec)
    with gzip.open(d / "metrics.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    (d / "dose_passk.json").write_text(json.dumps({"pass_at_k": {"1": 0.3, "4": 0.5, "16": 0.7}}))


def test_tables_pair_arms_by_seed(tmp_path):
    for seed, (g_bf16, g_unc, g_cal) in enumerate([(0.1, 0.05, 0.09), (0.12, 0.04, 0.1),
                                                   (0.08, 0.03, 0.07)], 1):  # fmt: skip
        _run(tmp_path / "grpo-dose-bf16", seed, g_bf16, 0.0, 0.01)
        _run(tmp_path / "grpo-dose-nvfp4-uncalibrated", seed, g_unc, 0.05, 0.04)
        _run(tmp_path / "grpo-dose-nvfp4", seed, g_cal, 0.05, 0.02)
    table = dose_report.collect(tmp_path)
    assert set(table) == {"bf16", "nvfp4-uncalibrated", "nvfp4"}
    text = dose_report.format_table(table)
    row = next(line for line in text.splitlines() if line.startswith("| nvfp4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    loss = statistics.fmean([0.05 - 0.1, 0.04 - 0.12, 0.03 - 0.08])
    recovery = statistics.fmean([0.09 - 0.05, 0.1 - 0.04, 0.07 - 0.03])
    assert cells[1].startswith("0.0500") and cells[2].startswith(f"{loss:+.3f} [")
    assert cells[3].startswith(f"{recovery:+.3f} [") and cells[3].endswith("(n=3)")
    assert "| nvfp4-uncalibrated |" in dose_report.arm_table(table)
    assert dose_report.figures(tmp_path, tmp_path / "fig")[0].stat().st_size > 10_000


def _grid(tmp_path, gains: list[tuple[float, float, float]]):
    """BF16, NVFP4 uncalibrated and calibrated runs with the given accuracy gains per seed."""
    for seed, (g_bf16, g_unc, g_cal) in enumerate(gains, 1):
        _run(tmp_path / "grpo-dose-bf16", seed, g_bf16, 0.0, 0.01)
        _run(tmp_path / "grpo-dose-nvfp4-uncalibrated", seed, g_unc, 0.05, 0.04)
        _run(tmp_path / "grpo-dose-nvfp4", seed, g_cal, 0.05, 0.02)
    return dose_report.collect(tmp_path)


@pytest.mark.parametrize(
    ("gains", "says"),
    [  # each rule of the pre-registered verdict: loss and recovery, loss only, neither
        ([(0.1, 0.05, 0.09), (0.12, 0.04, 0.1), (0.08, 0.03, 0.07)], "starts to matter"),
        ([(0.1, 0.05, 0.06), (0.12, 0.04, 0.03), (0.08, 0.03, 0.03)], "below 0 at NVFP4"),
        ([(0.1, 0.11, 0.1), (0.12, 0.1, 0.12), (0.08, 0.09, 0.08)], "below 0 at no format"),
    ],
)
def test_verdict_follows_the_pre_registered_rule(tmp_path, gains, says):
    from nemo_fp8_rl.study import dose_verdict

    table = _grid(tmp_path, gains)
    (row,) = dose_verdict.per_format(table)
    assert row["loss"].n == 3 and row["recovery"].n == 3
    text = dose_verdict.verdict(table)
    assert says in text and "NVFP4" in text and "(n=3)" in text
    matters = says == "starts to matter"
    assert ("calibration mattered at no format" in text) is not matters
    assert "Post hoc (not part of the rule)" in text
    assert dose_verdict.headline(table).count(". ") >= 1  # two sentences
    assert "Not run" in text and "mxfp4-uncalibrated (seeds 1, 2, 3, 5, 6)" in text


def test_verdict_and_tables_in_docs_match_the_archived_runs():
    """docs/study/dose.md's generated blocks are what `dose_study.py table --write` writes from
    the committed archive (docs/study/dose/runs)."""
    from nemo_fp8_rl.study import dose_verdict
    from nemo_fp8_rl.study.doc_blocks import replace_block

    page = dose_report.PAGE.read_text(encoding="utf-8")
    table = dose_report.collect()
    for marks, body in (
        (dose_report.TABLES, dose_report.markdown()),
        (dose_report.VERDICT, dose_verdict.verdict(table)),
    ):
        assert replace_block(page, marks, body, "dose.md") == page, marks[0]
