"""Compare over seeds: runs grouped by recipe, intervals per metric, verdict wording, band plots
and the grouped command line. Runs are written by the embedded engine's real `MetricsLogger`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from nemo_fp8_rl.analysis.groups import compare_groups, group_runs
from nemo_fp8_rl.analysis.report import PLOTS
from nemo_fp8_rl.analysis.report_groups import band_data, draw_band_plot, table_rows
from nemo_fp8_rl.analysis.rundata import load_run
from nemo_fp8_rl.cli.compare import expand_seed_groups, main
from nemo_fp8_rl.engines.local.metrics import MetricsLogger

STEPS = 20


R = "mean validation accuracy after step 0, scored in rollout precision"


def write_seed_run(
    root: Path,
    recipe: str,
    seed: int,
    *,
    fp8: bool,
    acc: float,
    clip: float,
    folder=None,
    extra: dict | None = None,
) -> Path:
    """`root/<recipe>/seed-<seed>`: recipe.yaml as the engine saves it, metrics via MetricsLogger."""
    run_dir = root / recipe / (folder or f"seed-{seed}")
    run_dir.mkdir(parents=True)
    config = {
        "grpo": {"max_num_steps": STEPS, "seed": seed},
        "logger": {"wandb": {"name": recipe}, "log_dir": str(run_dir / "logs")},
        "policy": {"generation": {"vllm_cfg": {"precision": "fp8" if fp8 else "bfloat16"}}},
    }
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(config))
    logger = MetricsLogger(run_dir, tensorboard=False)
    for step in range(1, STEPS + 1):
        metrics = {
            "train/reward": acc * step / STEPS,
            "train/entropy": 0.8,
            "train/clip_lower_frac_neg": clip * (1 + 0.1 * np.sin(step)),
            "timing/train/total_step_time": 1.0,
        }
        if step % 10 == 0:  # constant: the endpoint (mean after step 0) is `acc` itself
            metrics["validation/accuracy"] = acc
        logger.log(step, {**metrics, **(extra or {})})
    logger.close()
    return run_dir


@pytest.fixture
def grouped(tmp_path):
    """BF16 and FP8, seeds 1-3; FP8 is 5 points lower on every seed and clips 2x as much."""
    base = {1: 0.50, 2: 0.60, 3: 0.70}
    for seed, acc in base.items():
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=acc, clip=0.01 * seed)
        write_seed_run(tmp_path, "fp8", seed, fp8=True, acc=acc - 0.05, clip=0.02 * seed)
    return tmp_path


def _runs(root: Path, *names: str):
    return [load_run(p) for p in expand_seed_groups([str(root / n) for n in names])]


def test_recipe_folder_expands_to_its_seeds_and_groups_by_recipe(grouped):
    paths = expand_seed_groups([str(grouped / "bf16"), str(grouped / "fp8" / "seed-2")])
    assert [p.name for p in paths] == ["seed-1", "seed-2", "seed-3", "seed-2"]
    groups = group_runs([load_run(p) for p in paths])
    assert [(g.name, g.seeds) for g in groups] == [("bf16", [1, 2, 3]), ("fp8", [2])]


def test_paired_constant_gap_is_a_zero_width_interval_and_says_lower(grouped):
    comparison = compare_groups(_runs(grouped, "bf16", "fp8"))
    gap = comparison.gaps["fp8"]
    assert gap.paired and gap.step == 20 and gap.label == R
    assert (gap.interval.estimate, gap.interval.low, gap.interval.high) == pytest.approx(
        (-5, -5, -5)
    )
    (verdict,) = comparison.verdicts
    assert verdict.startswith("fp8 (FP8, 3 seeds 1, 2, 3): 5.0 points lower than BF16 [-5.0, -5.0]")
    assert "95 % Student-t interval over n = 3 seeds, paired by seed" in verdict
    ratio = comparison.ratios["fp8"]["clip_low_neg"]  # Fieller: BF16's mean 0.01 ± wide
    assert ratio.estimate == pytest.approx(2.0) and ratio.method == "Fieller, paired"
    assert "lower-bound clipping of A<0 tokens 2.00x [" in verdict and "(n=3) BF16's" in verdict
    bf16 = comparison.summaries[0].stats["val_acc_final"]
    assert bf16.estimate == pytest.approx(0.6) and bf16.low < 0.6 < bf16.high


def test_gap_inside_seed_noise_is_within_noise(tmp_path):
    for seed, (a, b) in {1: (0.5, 0.53), 2: (0.6, 0.57), 3: (0.7, 0.71)}.items():
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=a, clip=0.01)
        write_seed_run(tmp_path, "fp8", seed, fp8=True, acc=b, clip=0.01)
    (verdict,) = compare_groups(_runs(tmp_path, "bf16", "fp8")).verdicts
    # differences +3, -3, +1: mean 0.33, s = 3.06, t(2) = 4.30 -> ±7.6
    assert "within noise of BF16: +0.3 points [-7.3, +7.9]" in verdict


def test_one_seed_each_says_it_rests_on_one_run(tmp_path, capsys):
    write_seed_run(tmp_path, "bf16", 1, fp8=False, acc=0.6, clip=0.01)
    write_seed_run(tmp_path, "fp8", 1, fp8=True, acc=0.5, clip=0.01)
    (verdict,) = compare_groups(_runs(tmp_path, "bf16", "fp8")).verdicts
    assert (
        f"lower than BF16: -10.0 points ({R} at step 20), beyond the ±2-point tolerance; this rests on one run"
        in verdict
    )
    assert "[" not in verdict.split(";")[0]
    out = tmp_path / "out"
    assert (
        main([str(tmp_path / "bf16"), str(tmp_path / "fp8"), "--out", str(out), "--no-plots"]) == 0
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert "rests on one run per recipe" in printed
    assert "rests on one run per recipe" in (out / "report.md").read_text()


def test_table_rows_show_mean_interval_and_paired_difference(grouped):
    headers, rows = table_rows(compare_groups(_runs(grouped, "bf16", "fp8")))
    assert headers == ["metric", "bf16 (bf16, n=3)", "fp8 (fp8, n=3)", "fp8 - bf16"]
    row = next(r for r in rows if r[0] == "val acc final")
    assert row[1].startswith("0.600 [") and row[3] == "-0.050 [-0.050, -0.050] (n=3) (paired)"
    assert next(r for r in rows if r[0] == "seeds")[1:3] == ["1, 2, 3", "1, 2, 3"]


def test_band_plot_data_is_mean_over_seeds_with_smoothing_in_the_label(grouped):
    comparison = compare_groups(_runs(grouped, "bf16", "fp8"))
    spec = next(s for s in PLOTS if s.name == "reward_accuracy")
    reward, accuracy = band_data(comparison, spec)
    assert reward[0].smoothing == "EMA alpha=0.2" and "EMA alpha=0.2" in reward[0].label
    acc = accuracy[1]
    assert acc.smoothing is None and list(acc.steps) == [10, 20]
    assert acc.mean == pytest.approx([0.55, 0.55])
    assert np.all(acc.low <= acc.mean) and np.all(acc.mean <= acc.high)
    fig = draw_band_plot(spec, [reward, accuracy])
    ax = fig.axes[1]
    assert [line.get_label() for line in ax.get_lines()] == [
        "bf16 (3 seeds, mean, band: 95 % Student-t interval)",
        "fp8 (3 seeds, mean, band: 95 % Student-t interval)",
    ]
    assert len(ax.collections) == 2  # one shaded band per recipe


def test_cli_grouped_report(grouped, capsys):
    out = grouped / "report"
    assert main([str(grouped / "bf16"), str(grouped / "fp8"), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "5.0 points lower than BF16 [-5.0, -5.0]" in printed
    report = (out / "report.md").read_text()
    assert "## Seeds" in report and "![reward_accuracy](reward_accuracy.png)" in report
    assert (out / "reward_accuracy.png").is_file() and (out / "runs" / "report.md").is_file()
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_seeds_of_one_recipe_only_are_compared_run_by_run(grouped, capsys):
    out = grouped / "r"
    assert main([str(grouped / "bf16"), "--out", str(out), "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    assert "bf16/seed-1" in report and "bf16/seed-3" in report
    assert "no FP8 run to judge" in report and "rests on one run" not in report


def test_entropy_quartile_split_row_and_plot(tmp_path):
    split = {
        f"train/overclip_share_entropy_q{q}": v
        for q, v in zip(range(1, 5), (0.0, 0.05, 0.15, 0.8), strict=True)
    }
    for seed in (1, 2):
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=0.5, clip=0.01)
        write_seed_run(tmp_path, "fp8", seed, fp8=True, acc=0.5, clip=0.02, extra=split)
    comparison = compare_groups(_runs(tmp_path, "bf16", "fp8"))
    _, rows = table_rows(comparison)
    row = next(r for r in rows if r[0] == "over-clip share, entropy Q4")
    assert row[1:3] == ["-", "0.800 [0.800, 0.800] (n=2)"]
    assert not any(r[0].startswith("lower-clip share") for r in rows)  # not logged: no row
    from nemo_fp8_rl.analysis.report_groups import draw_overclip_plot

    fig = draw_overclip_plot(comparison)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == pytest.approx([0, 0, 0, 0, 0.0, 0.05, 0.15, 0.8])


def test_two_seeds_verdict_warns_the_interval_is_their_range(tmp_path):
    for seed, (a, b) in {1: (0.5, 0.4), 2: (0.6, 0.55)}.items():
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=a, clip=0.01)
        write_seed_run(tmp_path, "fp8", seed, fp8=True, acc=b, clip=0.01)
    (verdict,) = compare_groups(_runs(tmp_path, "bf16", "fp8")).verdicts
    # differences -10 and -5: mean -7.5, s = 3.54, t(1) = 12.71 -> ±31.8: within noise
    assert "within noise of BF16: -7.5 points [-39.3, +24.3]" in verdict
    assert "over 2 seeds the t factor is 12.7" in verdict


def test_entropy_shares_are_pooled_over_steps_by_token_count(tmp_path):
    """Step 1: 1 over-clipped token, all in Q1; step 2: 3 tokens, all in Q4 -> pooled Q4 = 3/4
    (a plain mean over steps would say 1/2)."""
    run = write_seed_run(tmp_path, "fp8", 1, fp8=True, acc=0.5, clip=0.01)
    logger = MetricsLogger(run, tensorboard=False, completed_steps=STEPS)
    for step, (q1, q4, n) in {
        21: (1.0, 0.0, 1.0),
        22: (0.0, 1.0, 3.0),
        23: (float("nan"), float("nan"), 0.0),
    }.items():
        logger.log(
            step,
            {
                "train/overclip_share_entropy_q1": q1,
                "train/overclip_share_entropy_q4": q4,
                "train/overclip_neg_tokens": n,
            },
        )
    logger.close()
    from nemo_fp8_rl.analysis.groups import EXTRA_COLUMNS, run_value

    q4 = next(c for c in EXTRA_COLUMNS if c.key == "overclip_q4")
    assert run_value(load_run(run), q4) == pytest.approx(0.75)


def test_cells_say_how_many_seeds_had_a_value(tmp_path):
    split = {"train/overclip_share_entropy_q4": 0.5, "train/overclip_neg_tokens": 2.0}
    for seed in (1, 2):
        write_seed_run(tmp_path, "bf16", seed, fp8=False, acc=0.5, clip=0.01)
        write_seed_run(
            tmp_path, "fp8", seed, fp8=True, acc=0.5, clip=0.01, extra=split if seed == 1 else None
        )
    _, rows = table_rows(compare_groups(_runs(tmp_path, "bf16", "fp8")))
    assert next(r for r in rows if r[0] == "over-clip share, entropy Q4")[2] == "0.500 (n=1)"
    assert next(r for r in rows if r[0] == "over-clipped A<0 tokens (sum)")[2] == "40 (n=1)"
