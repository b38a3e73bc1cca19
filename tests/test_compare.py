"""Reading runs (JSONL, TensorBoard events) and comparing them: summaries, alignment, verdicts, recipe diffs.

Runs are written with the real writers: the embedded engine's `MetricsLogger` (JSONL + torch's
`SummaryWriter`), torch's `SummaryWriter` laid out as NeMo RL's `TensorboardLogger` does
(`<log_dir>/exp_001/tensorboard/`), and TensorBoard's own `Writer` (tensor-valued scalars).
The metric values come from `synthetic_metrics`, so every expected number is recomputed here
from the same inputs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from nemo_fp8_rl.analysis.compare import TAIL_STEPS, align, compare_runs, speedup
from nemo_fp8_rl.analysis.recipe_diff import FORCED, diff_configs, group_of, precision_of
from nemo_fp8_rl.analysis.rundata import RunReadError, load_run, read_event_file, read_jsonl
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.compare import main
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.engines.local.metrics import MetricsLogger

VAL_PERIOD = 10


def synthetic_metrics(
    step: int, steps: int, *, acc_final: float, step_s: float, surge_at: int | None = None
) -> dict[str, float]:
    """One step's metrics with NeMo RL / project names; deterministic, smooth, easy to recompute."""
    wiggle = math.sin(1.3 * step)
    entropy = 0.8 + 0.004 * wiggle + (0.5 if surge_at is not None and step >= surge_at else 0.0)
    metrics = {
        "train/reward": 0.2 + 0.5 * step / steps + 0.01 * wiggle,
        "train/entropy": entropy,
        "train/clip_lower_frac_neg": 0.02 + 0.001 * wiggle,
        "train/clip_upper_frac_pos": 0.01,
        "train/clip_dual_frac_neg": 0.0,
        "train/token_mult_prob_error": 1.01 + 0.001 * wiggle,
        "train/gen_kl_error": 1e-4 * (2 + wiggle),
        "timing/train/total_step_time": step_s * (3.0 if step == 1 else 1.0 + 0.02 * wiggle),
        "timing/train/generate": 0.4 * step_s,
        "timing/train/policy_training": 0.5 * step_s,
        "throughput/tokens_per_sec": 1000.0 / step_s,
    }
    if step % VAL_PERIOD == 0:
        metrics["validation/accuracy"] = acc_final * step / steps
    return metrics


def tiny_config(precision: str, **extra: object) -> dict:
    """The slice of a resolved recipe that `compare` reads (precision keys and max steps)."""
    fp8 = precision == "fp8"
    config = {
        "grpo": {"max_num_steps": extra.pop("max_num_steps", 40), "seed": extra.pop("seed", 1)},
        "policy": {
            "generation": {"vllm_cfg": {"precision": "fp8" if fp8 else "bfloat16"}},
            "megatron_cfg": {"fp8_cfg": {"enabled": fp8}},
        },
        "loss_fn": {"calibration": {"enabled": fp8}},
    }
    return config


def write_project_run(
    run_dir: Path, steps: int, *, precision: str, tensorboard: bool = False, **kw
) -> Path:
    """A project run directory written by the embedded engine's real `MetricsLogger`."""
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(
        yaml.safe_dump(tiny_config(precision, max_num_steps=kw.pop("max_num_steps", steps)))
    )
    logger = MetricsLogger(run_dir, tensorboard=tensorboard)
    for step in range(1, steps + 1):
        logger.log(step, synthetic_metrics(step, steps, **kw))
    logger.close()
    return run_dir


def write_nemo_rl_run(log_dir: Path, steps: int, **kw) -> Path:
    """TensorBoard events laid out and named as NeMo RL's Logger writes them."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir / "exp_001" / "tensorboard"))
    for step in range(1, steps + 1):
        for name, value in synthetic_metrics(step, steps, **kw).items():
            writer.add_scalar(name, value, step)
    writer.close()
    return log_dir


def expected(steps: int, metric: str, **kw) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic series of `metric` as the runs hold it."""
    points = [(s, synthetic_metrics(s, steps, **kw).get(metric)) for s in range(1, steps + 1)]
    points = [(s, v) for s, v in points if v is not None]
    return np.array([s for s, _ in points]), np.array([v for _, v in points])


# ----------------------------------------------------------------------------- reading


def test_jsonl_later_lines_win_and_null_is_nan(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "train/reward": 0.1, "train/entropy": null}\n'
        '{"step": 2, "train/reward": 0.2, "note": "text", "flag": true}\n'
        '{"step": 1, "train/reward": 0.15}\n'
        '\n{"step": 2, "validation/accuracy": NaN}\n'
    )
    rows, notes = read_jsonl(path)
    assert notes == []
    assert rows[1]["train/reward"] == 0.15 and math.isnan(rows[1]["train/entropy"])
    assert set(rows[2]) == {"train/reward", "validation/accuracy"}
    assert math.isnan(rows[2]["validation/accuracy"])


def test_jsonl_corrupt_lines_are_skipped_and_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "train/reward": 0.1}\n{"step": 2, "train/re\n{"train/reward": 3}\n{"step": 3, "train/reward": 0.3}\n{"step": 4, "train/rew'
    )
    rows, notes = read_jsonl(path)
    assert sorted(rows) == [1, 3]
    assert any("line 2 is not valid JSON" in n and "still writing" not in n for n in notes)
    assert any("line 3 has no integer 'step'" in n for n in notes)
    assert any("last line 5 is not valid JSON (a run still writing it?)" in n for n in notes)


def test_nemo_rl_tensorboard_events_read_back_exactly(tmp_path):
    write_nemo_rl_run(tmp_path / "logs", 30, acc_final=0.5, step_s=2.0)
    run = load_run(tmp_path / "logs")
    assert len(run.sources) == 1 and run.sources[0].parent.name == "tensorboard"
    for metric in ("train/reward", "validation/accuracy", "timing/train/total_step_time"):
        steps, values = expected(30, metric, acc_final=0.5, step_s=2.0)
        np.testing.assert_array_equal(run.metrics[metric].steps, steps)
        np.testing.assert_allclose(run.metrics[metric].values, values.astype(np.float32), rtol=1e-7)


def test_tensorboard_writer_tensor_scalars_and_nan(tmp_path):
    from tensorboard.summary import Writer

    writer = Writer(str(tmp_path / "tb"))
    for step, value in [(1, 0.25), (2, float("nan")), (3, 0.75)]:
        writer.add_scalar("validation/accuracy", value, step=step)
    writer.close()
    series = load_run(tmp_path / "tb").metrics["validation/accuracy"]
    assert series.steps.tolist() == [1, 2, 3]
    assert series.values[0] == 0.25 and math.isnan(series.values[1]) and series.values[2] == 0.75
    assert series.finite().steps.tolist() == [1, 3]


def test_truncated_event_file_keeps_complete_records(tmp_path):
    write_nemo_rl_run(tmp_path / "logs", 20, acc_final=0.5, step_s=1.0)
    event_file = next((tmp_path / "logs").rglob("events.out.tfevents.*"))
    data = event_file.read_bytes()
    event_file.write_bytes(data[:-7])  # a writer interrupted mid-record
    rows, notes = read_event_file(event_file)
    assert len(notes) == 1 and "truncated record" in notes[0]
    assert max(rows) == 20 and 1 in rows
    assert len(rows[20]) < len(synthetic_metrics(20, 20, acc_final=0.5, step_s=1.0))


def test_project_run_reads_jsonl_and_notes_incomplete(tmp_path):
    run_dir = write_project_run(
        tmp_path / "run",
        12,
        precision="fp8",
        tensorboard=True,
        max_num_steps=40,
        acc_final=0.5,
        step_s=1.0,
    )
    run = load_run(run_dir)
    assert run.sources == [run_dir / "metrics.jsonl"]  # the TensorBoard copy is not read twice
    assert run.last_step == 12 and run.max_steps == 40
    assert any("incomplete, last step 12 of 40" in n for n in run.notes)
    assert precision_of(run.config) == "fp8"
    tb_only = load_run(run_dir / "logs")
    np.testing.assert_allclose(
        tb_only.metrics["train/reward"].values, run.metrics["train/reward"].values, rtol=1e-6
    )


def test_missing_run_and_empty_run_are_clear_errors(tmp_path):
    with pytest.raises(RunReadError, match="no such file"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunReadError, match="neither metrics.jsonl nor TensorBoard"):
        load_run(tmp_path / "empty")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "metrics.jsonl").write_text("\n")
    with pytest.raises(RunReadError, match="hold no metrics"):
        load_run(tmp_path / "blank")


# ----------------------------------------------------------------------------- comparing


@pytest.fixture
def pair(tmp_path):
    """A BF16 run and an FP8 run 1.25x faster, 1 point lower, with an entropy surge at step 30."""
    bf16 = write_project_run(tmp_path / "bf16", 40, precision="bf16", acc_final=0.60, step_s=2.0)
    fp8 = write_project_run(
        tmp_path / "fp8", 40, precision="fp8", acc_final=0.59, step_s=1.6, surge_at=30
    )
    return load_run(bf16), load_run(fp8)


def test_summary_values_follow_from_the_logged_series(pair):
    comparison = compare_runs(pair)
    bf16, fp8 = comparison.summaries
    assert (bf16.precision, fp8.precision) == ("bf16", "fp8")
    _, reward = expected(40, "train/reward", acc_final=0.6, step_s=2.0)
    assert bf16.values["reward"] == pytest.approx(reward[-TAIL_STEPS:].mean())
    assert bf16.values["val_acc_final"] == pytest.approx(0.60) and bf16.best_val_step == 40
    _, times = expected(40, "timing/train/total_step_time", acc_final=0.59, step_s=1.6)
    assert fp8.values["step_time"] == pytest.approx(times[1:].mean())  # first step is warm-up
    assert fp8.values["t_generate"] == pytest.approx(0.4 * 1.6)
    assert fp8.values["speedup"] == pytest.approx(1.25, rel=1e-3) and bf16.values["speedup"] == 1.0
    assert math.isnan(fp8.values["calib_low"])
    assert "train/calib_low" in fp8.missing and "timing/train/refit" in fp8.missing
    assert "train/reward" not in fp8.missing


def test_verdict_names_gap_speed_and_surge_step(pair):
    comparison = compare_runs(pair)
    assert comparison.summaries[1].surge_step == 30 and comparison.summaries[0].surge_step is None
    assert comparison.verdicts == [
        # accuracy rises linearly to its final value; the endpoint is the mean over steps 10-40
        # (0.625 of the final), so a 1.0-point final gap is a 0.6-point gap
        "fp8 (FP8): matches BF16: -0.6 points on mean validation accuracy after step 0, scored in rollout precision to step 40, within the ±2-point tolerance, 1.25x faster, entropy surge at step 30 (z-score detector)"
    ]
    strict = compare_runs(pair, tolerance_points=0.5)
    assert "below BF16: -0.6 points" in strict.verdicts[0]
    assert "beyond the ±0.5-point tolerance" in strict.verdicts[0]


def test_a_surge_the_bf16_reference_shows_too_is_not_called_fp8s(tmp_path):
    """Both runs surge at step 30 (one rule, the z-score detector): the FP8 verdict says BF16
    has it too, so the surge is not the precision's."""
    bf16 = write_project_run(
        tmp_path / "bf16", 40, precision="bf16", acc_final=0.6, step_s=2.0, surge_at=30
    )
    fp8 = write_project_run(
        tmp_path / "fp8", 40, precision="fp8", acc_final=0.6, step_s=2.0, surge_at=30
    )
    comparison = compare_runs([load_run(bf16), load_run(fp8)])
    assert comparison.summaries[0].surge_steps == [30]
    assert comparison.verdicts[0].endswith(
        "entropy surge at step 30 (z-score detector), as in bf16 (step 30): not this precision's"
    )


def test_no_surge_and_slower_run(tmp_path):
    a = load_run(write_project_run(tmp_path / "a", 30, precision="bf16", acc_final=0.5, step_s=1.0))
    b = load_run(write_project_run(tmp_path / "b", 30, precision="fp8", acc_final=0.5, step_s=2.0))
    (line,) = compare_runs([a, b]).verdicts
    assert line.endswith(
        "matches BF16: +0.0 points on mean validation accuracy after step 0, scored in rollout precision to step 30, within the ±2-point tolerance, 2.00x slower, no entropy surge (z-score detector)"
    )


def test_runs_of_different_length_align_on_common_steps(tmp_path):
    long = load_run(
        write_project_run(tmp_path / "long", 40, precision="bf16", acc_final=0.8, step_s=2.0)
    )
    short = load_run(
        write_project_run(
            tmp_path / "short", 25, precision="fp8", acc_final=0.8, step_s=1.0, max_num_steps=40
        )
    )
    steps, table = align([long, short], "validation/accuracy")
    assert steps.tolist() == [10, 20, 30, 40]
    assert np.isnan(table[1, 2:]).all() and np.isfinite(table[0]).all()
    comparison = compare_runs([long, short])
    # Accuracy is the mean over the common validations after step 0 (steps 10 and 20).
    assert (
        "points on mean validation accuracy after step 0, scored in rollout precision to step 20"
        in comparison.verdicts[0]
    )
    assert comparison.verdicts[0].startswith("short (FP8): above BF16: +")
    gap = 100 * (0.8 * 15 / 25 - 0.8 * 15 / 40)
    assert f"+{gap:.1f} points" in comparison.verdicts[0]
    _, t_long = expected(40, "timing/train/total_step_time", acc_final=0.8, step_s=2.0)
    _, t_short = expected(25, "timing/train/total_step_time", acc_final=0.8, step_s=1.0)
    assert speedup(long, short) == pytest.approx(t_long[1:25].mean() / t_short[1:].mean())
    assert any("incomplete, last step 25 of 40" in n for n in comparison.summaries[1].notes)


def test_nan_values_and_missing_metrics(tmp_path):
    a = load_run(write_project_run(tmp_path / "a", 20, precision="bf16", acc_final=0.5, step_s=1.0))
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    lines = [
        {
            "step": s,
            "train/reward": (None if s % 3 == 0 else 0.1 * s),
            "timing/train/total_step_time": 0.5,
        }
        for s in range(1, 21)
    ]
    (b_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    comparison = compare_runs([a, load_run(b_dir)])
    summary = comparison.summaries[1]
    finite = [0.1 * s for s in range(1, 21) if s % 3]
    assert summary.values["reward"] == pytest.approx(np.mean(finite[-TAIL_STEPS:]))
    assert summary.precision == "?" and "validation/bf16_accuracy" in summary.missing
    assert comparison.recipe_diff is None
    assert (
        "points on reward to step 20" in comparison.verdicts[0]
        and "entropy not logged" in comparison.verdicts[0]
    )


def test_nemo_rl_names_are_read_through_aliases(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "nemo" / "exp_001" / "tensorboard"))
    for step in range(1, 6):
        writer.add_scalar("timing/train/generation", 0.5 * step, step)
        writer.add_scalar("timing/train/total_step_time", 1.0, step)
        writer.add_scalar("train/approx_entropy", 0.3, step)
    writer.close()
    other = load_run(
        write_project_run(tmp_path / "ours", 5, precision="bf16", acc_final=0.5, step_s=1.0)
    )
    summary = compare_runs([other, load_run(tmp_path / "nemo")]).summaries[1]
    assert summary.values["t_generate"] == pytest.approx(np.mean([0.5 * s for s in range(2, 6)]))
    assert "timing/train/generate read from timing/train/generation" in summary.notes
    assert summary.values["entropy"] == pytest.approx(0.3)


def test_compare_needs_two_runs(pair):
    with pytest.raises(ValueError, match="two or more runs"):
        compare_runs(pair[:1])


# ----------------------------------------------------------------------------- recipes


def test_group_of_keys():
    assert group_of("policy.generation.vllm_cfg.precision") == "precision"
    assert group_of("policy.megatron_cfg.fp8_cfg.fp8_recipe") == "precision"
    assert group_of("loss_fn.calibration.interval") == "calibration"
    assert group_of("refit.bucket_size_mb") == "refit"
    assert group_of("logger.log_dir") == "derived"
    assert group_of("grpo.seed") == "other"


def test_tiny_pair_is_fair_and_grouped():
    bf16, fp8 = (load_recipe(f"tiny/grpo-tiny-qwen3-cpu-{v}") for v in ("bf16", "fp8"))
    diff = diff_configs(["bf16", "fp8"], [bf16.config, fp8.config])
    assert diff.fair and diff.warnings == []
    groups = diff.by_group()
    assert list(groups) == ["precision", "calibration", "derived"]
    entry = next(e for e in groups["precision"] if e.key == "policy.generation.vllm_cfg.precision")
    assert entry.values == ("bfloat16", "fp8")
    assert [e.key for e in groups["calibration"]] == ["loss_fn.calibration.enabled"]


def test_gpu_pairs_differ_only_in_precision_or_stated_forced_keys():
    """A FORCED key (the FP8 engine needs it) is shown as such, with its reason, and stays fair."""
    llama = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g"
    bf16, fp8 = (load_recipe(f"{llama}-{v}") for v in ("bf16", "fp8"))
    diff = diff_configs(["bf16", "fp8"], [bf16.config, fp8.config])
    assert diff.fair and diff.warnings == []
    (forced,) = diff.by_group()["forced"]
    assert forced.key == "policy.generation.vllm_kwargs.kv_cache_memory_bytes"
    assert forced.values == ("<absent>", 21474836480)
    assert diff.notes == [f"forced: {forced.key}: {FORCED[forced.key]}"]
    qwen = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g"
    pair = [load_recipe(f"{qwen}-{v}").config for v in ("bf16", "fp8")]
    groups = diff_configs(["bf16", "fp8"], pair).by_group()
    assert [e.key for e in groups["forced"]] == [forced.key] and "other" not in groups
    keys = [e.key for g in groups.values() for e in g]
    assert "policy.generation.vllm_cfg.gpu_memory_utilization" not in keys


def test_pair_differing_elsewhere_warns_with_the_keys():
    bf16 = load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16")
    fp8 = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", ["grpo.seed=7"])
    diff = diff_configs(["bf16", "fp8"], [bf16.config, fp8.config])
    assert not diff.fair
    # data.train.seed interpolates grpo.seed, so the resolved configs differ in both.
    assert diff.warnings == [
        "not a fair precision comparison: 2 key(s) differ outside the precision/refit/calibration"
        " groups: data.train.seed, grpo.seed"
    ]
    three = diff_configs(["a", "b", "c"], [bf16.config, bf16.config, fp8.config])
    assert {e.key: e.values for e in three.entries}["grpo.seed"] == (1, 1, 7)


def test_absent_keys_and_bad_arguments():
    diff = diff_configs(["a", "b"], [{"x": {"y": 1}, "z": {}}, {"x": {}}])
    assert [(e.key, e.values) for e in diff.entries] == [("x.y", (1, "<absent>"))]
    with pytest.raises(ValueError, match="two or more configs"):
        diff_configs(["a"], [{}])


# ----------------------------------------------------------------------------- command line


def test_cli_recipes(capsys, tmp_path):
    refs = ["tiny/grpo-tiny-qwen3-cpu-bf16", "tiny/grpo-tiny-qwen3-cpu-fp8"]
    assert main([*refs, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Recipe differences" in out and "calibration" in out and "warning" not in out
    text = (tmp_path / "recipes.md").read_text()
    assert "| precision | policy.generation.vllm_cfg.precision | bfloat16 | fp8 |" in text
    # Overrides apply to every recipe, so the pair stays fair.
    assert main([*refs, "grpo.seed=3"]) == 0
    assert "warning" not in capsys.readouterr().out
    assert main([refs[0], "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"]) == 0
    assert "not a fair precision comparison" in " ".join(capsys.readouterr().out.split())


def test_cli_runs_write_report(pair, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(pair[0].path), str(pair[1].path), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "entropy surge at step 30" in printed.replace("\n", " ")
    assert (out / "report.md").is_file() and (out / "report.html").is_file()


def test_cli_errors(pair, tmp_path, capsys):
    assert invoke(main, [str(pair[0].path), str(tmp_path / "typo")]) == 2
    assert (
        "typo: neither a run (no such directory or metrics file) nor a recipe"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main([str(pair[0].path), "tiny/grpo-tiny-qwen3-cpu-fp8"])
    assert "either runs or recipes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(pair[0].path), str(pair[1].path), "grpo.seed=1"])
    assert "overrides apply to recipes only" in capsys.readouterr().err


# ----------------------------------------------------------------------------- entropy surges


def _entropy_series(seed: int, steps: int = 120) -> tuple[list[int], list[float]]:
    """Noisy entropy with random level shifts, spikes and NaN gaps."""
    rng = np.random.default_rng(seed)
    values = 0.8 + rng.normal(0, rng.choice([0.002, 0.01, 0.05]), steps)
    for start in rng.integers(5, steps, size=rng.integers(0, 4)):
        values[start:] += rng.choice([0.03, 0.1, 0.4, -0.2])
    values[rng.random(steps) < 0.03] = np.nan
    return list(range(1, steps + 1)), values.tolist()


@pytest.mark.parametrize("seed", range(40))
def test_surge_onsets_match_the_diagnostics_detector(seed):
    from nemo_fp8_rl.analysis.compare import entropy_surges
    from nemo_fp8_rl.analysis.rundata import Series
    from nemo_fp8_rl.analysis.surge import detect_entropy_surges

    steps, values = _entropy_series(seed)
    ours = entropy_surges(Series(np.array(steps), np.array(values)))
    assert ours == detect_entropy_surges(steps, values)


def test_surge_examples():
    from nemo_fp8_rl.analysis.compare import entropy_surges
    from nemo_fp8_rl.analysis.rundata import Series

    flat = 0.8 + 0.004 * np.sin(1.3 * np.arange(1, 61))
    assert entropy_surges(Series(np.arange(1, 61), flat)) == []
    jump = flat.copy()
    jump[40:] += 0.3  # steps 41.. ; the window re-baselines, so one onset
    assert entropy_surges(Series(np.arange(1, 61), jump)) == [41]
    small = flat.copy()
    small[40:] += 0.03  # many sigmas, but below the minimum rise of 0.05 nats
    assert entropy_surges(Series(np.arange(1, 61), small)) == []


def test_event_files_of_two_launches_are_merged_with_a_note(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for exp, steps, value in (("exp_001", range(1, 6), 1.0), ("exp_002", range(4, 9), 2.0)):
        writer = SummaryWriter(log_dir=str(tmp_path / "logs" / exp / "tensorboard"))
        for step in steps:
            writer.add_scalar("train/reward", value, step)
        writer.close()
    run = load_run(tmp_path / "logs")
    assert run.metrics["train/reward"].steps.tolist() == list(range(1, 9))
    assert (
        run.metrics["train/reward"].values.tolist() == [1.0] * 3 + [2.0] * 5
    )  # resumed launch wins
    assert any("merged event files from 2 folders" in n for n in run.notes)
    assert load_run(tmp_path / "logs" / "exp_001").notes == []


def test_validation_at_step_zero_only_falls_back_to_reward(tmp_path):
    dirs = []
    for name, accuracy, rewards in (("a", 0.1, [0.2, 0.3, 0.4]), ("b", 0.5, [0.2, 0.3, 0.7])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        lines = [{"step": 0, "validation/accuracy": accuracy}]
        lines += [{"step": s, "train/reward": r} for s, r in enumerate(rewards, start=1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        dirs.append(load_run(run_dir))
    (line,) = compare_runs(dirs).verdicts
    assert "above a: +10.0 points on reward to step 3" in line  # mean over 3 steps: 0.4 vs 0.3
