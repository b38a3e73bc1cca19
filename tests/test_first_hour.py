"""What a new user meets first: usage lines, exit codes as README's table says, dry runs that
say whether anything could run, and the habits of NeMo RL, torchtune and TRL users (`--config`,
`recipes ls`, `python -m nemo_fp8_rl`, `nemo_fp8_rl.env`, `recipes cp --full`)."""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from catalogue_cases import Workspace

from nemo_fp8_rl.cli import eval as eval_cli
from nemo_fp8_rl.cli import recipes, refit, study, train
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.loader import load_chain

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
T = "tiny/grpo-tiny-qwen3-cpu-fp8"


def _nemo_rl_usable() -> bool:
    from nemo_fp8_rl.engines.nemo.driver.compat import available

    return available()[0]


def test_subcommand_usage_names_the_subcommand(capsys):
    assert invoke(recipes.main, ["show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: nemo_fp8_rl.recipes show [-h]"), err
    assert "{list" not in err and "required: recipe." in err  # overrides are optional
    assert invoke(refit.main, ["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: nemo_fp8_rl.refit export [-h]") and "SRC OUT" not in out


def test_validate_unknown_recipe_is_a_configuration_error(capsys):
    assert invoke(recipes.main, ["validate", "NOSUCH"]) == 2
    captured = capsys.readouterr()
    assert "NOSUCH: recipes validate: no such recipe" in captured.out
    assert "--recipe" not in captured.out + captured.err


@pytest.mark.skipif(_nemo_rl_usable(), reason="NeMo RL is usable here: the GPU recipe can run")
@pytest.mark.parametrize(
    "argv",
    [["--recipe", "qwen3-4b/grpo-qwen3-4b-1n8g-fp8"], ["--recipe", T, "--engine", "nemo"]],
    ids=["gpu-recipe", "engine-nemo"],
)
def test_dry_run_exits_3_when_no_engine_can_run(argv, capsys):
    assert invoke(train.main, [*argv, "--dry-run"]) == 3
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith("# engine: none usable here  run dir: runs/")
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("error: ")]
    (line,) = errors  # said once, in one line, not also in the YAML's comment
    assert captured.err.splitlines()[-1] == line  # the last thing a terminal shows
    assert (
        line.startswith("error: ") and "(dry run): the recipe is valid; a real run needs " in line
    )
    assert "NeMo RL is not importable" not in captured.out and len(line) < 400


def test_eval_dry_run_checks_and_writes_nothing(tmp_path, capsys):
    run_dir = Workspace(tmp_path, lambda: tmp_path).run("run")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert invoke(eval_cli.main, ["--run", str(run_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would evaluate {run_dir} last (step 2) on addition" in out
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (
        invoke(eval_cli.main, ["--run", str(run_dir), "--dry-run", "--checkpoint", "step_9"]) == 2
    )


def test_study_refuses_seeds_as_separate_words(tmp_path, capsys):
    argv = ["--analyse-only", "--out", "docs/study/runs", "--report", str(tmp_path), "--seeds"]
    assert invoke(study.main, [*argv, "1", "2", "3"]) == 2
    assert "Fix: give seeds as --seeds 1,2,3" in capsys.readouterr().err


def test_study_names_the_recorded_wall_time_as_the_runs():
    meta = {"study_wall_seconds": 3960.0}
    line = study._closing_line(meta, 3.2, True, Path("r"))
    assert line == (
        "this command took 3 s; the reported runs' recorded study wall time: 66 min; "
        "tables in r/tables.md"
    )
    assert "66 min" not in study._closing_line(meta, 3960.0, False, Path("r"))


def test_readme_tiny_table_names_a_missing_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("rtt", ROOT / "scripts/readme_tiny_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.main(["--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}/grpo-tiny-qwen3-cpu-bf16: no such run")
    assert "Fix: train it with `uv run nemo_fp8_rl.train --recipe tiny/grpo-tiny" in err


def test_config_is_recipe_and_ls_is_list(capsys):
    assert invoke(train.main, ["--config", T, "--dry-run"]) == 0
    assert "# engine: local  run dir: runs/grpo-tiny-qwen3-cpu-fp8" in capsys.readouterr().out
    assert invoke(recipes.main, ["ls", "tiny/*fp8"]) == 0
    assert T in capsys.readouterr().out


def test_python_m_package_and_new_console_scripts():
    for name in ("nemo_fp8_rl", "nemo_fp8_rl.study", "nemo_fp8_rl.env"):
        assert shutil.which(name, path=str(BIN)), f"console script {name} missing"
    out = subprocess.run(
        [sys.executable, "-m", "nemo_fp8_rl", "recipes", "ls", "tiny/*bf16"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    assert "tiny/grpo-tiny-qwen3-cpu-bf16" in out
    bad = subprocess.run([sys.executable, "-m", "nemo_fp8_rl", "trian"], capture_output=True,
                         text=True, cwd=ROOT)  # fmt: skip
    assert bad.returncode == 2 and "unknown command 'trian'" in bad.stderr


def test_env_reports_the_optional_stacks(capsys):
    from nemo_fp8_rl.cli import env as env_cli

    assert env_cli.main([]) == 0
    out = capsys.readouterr().out
    for name in ("nemo-fp8-rl", "Python", "torch", "NeMo RL", "vLLM", "Transformer Engine",
                 "megatron-core", "GPUs"):  # fmt: skip
        assert f"\n- {name}: " in out, name


def test_cp_full_writes_every_key_with_its_source(tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert invoke(recipes.main, ["cp", T, str(dest), "--full"]) == 0
    text = dest.read_text()
    assert "defaults" not in text.split("\n", 5)[-1]
    assert "fp8_recipe: blockwise  # configs/precision/fp8-blockwise.yaml" in text
    assert load_chain(dest)[0] == load_chain(ROOT / f"recipes/{T}.yaml")[0]
    mine, original = load_recipe(dest).config, load_recipe(T).config
    assert mine["policy"] == original["policy"] and mine["loss_fn"] == original["loss_fn"]


def test_closing_summary_reads_the_run(tmp_path, capsys):
    from nemo_fp8_rl.engines.local.metrics import MetricsLogger
    from nemo_fp8_rl.runs.summary import print_summary

    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(0, {"validation/accuracy": 0.25})
    for step, (neg, low) in enumerate(((0.02, 0.78), (0.04, 0.74)), start=1):
        logger.log(step, {"train/clip_lower_frac_neg": neg, "train/clip_upper_frac_pos": 0.01,
                          "train/calib_low": low, "train/calib_high": 1.25})  # fmt: skip
    logger.log(2, {"validation/accuracy": 0.5})
    logger.close()
    print_summary(tmp_path)
    out = capsys.readouterr().out
    assert (
        "validation accuracy (scored in rollout precision) 0.250 (step 0) -> 0.500 (step 2)" in out
    )
    assert "A<0 tokens below the lower bound 3.00 %; A>0 tokens above the upper bound 1.00 %" in out
    assert "clip bounds L,H 0.780,1.250 (step 1) -> 0.740,1.250 (step 2)" in out
    assert f"nemo_fp8_rl.eval --run {tmp_path}" in out and "nemo_fp8_rl.compare" in out


def test_started_at_stays_the_start(tmp_path):
    import json
    import os

    from nemo_fp8_rl.runs import rundir

    env = tmp_path / "environment.json"
    env.write_text(json.dumps({"started_at": "2000-01-01T00:00:00Z", "pid": os.getpid()}))
    rundir.write_environment(tmp_path, "local", {})
    assert json.loads(env.read_text())["started_at"] == "2000-01-01T00:00:00Z"
    env.write_text(json.dumps({"started_at": "2000-01-01T00:00:00Z", "pid": -1}))
    rundir.write_environment(tmp_path, "local", {})  # another process's file: a new start
    assert json.loads(env.read_text())["started_at"] != "2000-01-01T00:00:00Z"


def test_ray_token_notice_is_left_out():
    import logging

    from ray._private.authentication import authentication_token_setup as auth

    from nemo_fp8_rl.runs import ray_start

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    auth.logger.addHandler(handler)
    try:
        with ray_start._quiet_token_notice():
            auth._warn_token_auth_enabled()
            auth._warn_token_auth_disabled()  # any other notice still passes
    finally:
        auth.logger.removeHandler(handler)
    assert not any(m.startswith(ray_start.TOKEN_NOTICE) for m in seen)
    assert any("Token authentication is disabled" in m for m in seen)


def _cpu_run(run_dir: Path, precision: str, load: float | None, step_s: float) -> Path:
    """A CPU (embedded engine) run with the machine's load recorded at every step."""
    import yaml
    from test_compare import synthetic_metrics, tiny_config

    from nemo_fp8_rl.engines.local.metrics import MetricsLogger

    run_dir.mkdir(parents=True)
    config = {**tiny_config(precision, max_num_steps=10), "cluster": {"gpus_per_node": 0}}
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(config))
    logger = MetricsLogger(run_dir, tensorboard=False)
    for step in range(1, 11):
        metrics = synthetic_metrics(step, 10, acc_final=0.5, step_s=step_s)
        if load is not None:
            metrics["system/load_average_1min"] = load
        logger.log(step, metrics)
    logger.close()
    return run_dir


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ((1.0, 8.0), "speed not compared: the machine's load differed (1.0 vs 8.0"),
        ((1.0, None), "speed not compared: fp8 recorded no system/load_average_1min"),
        ((2.0, 2.2), "2.00x slower (FP8 emulated on the CPU: a measure of the emulation"),
    ],
    ids=["load-differs", "load-missing", "load-comparable"],
)
def test_cpu_speed_verdict_needs_comparable_load(tmp_path, loads, expected):
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.rundata import load_run
    from nemo_fp8_rl.analysis.verdict_json import runs_verdict

    runs = [
        load_run(_cpu_run(tmp_path / "bf16", "bf16", loads[0], 1.0)),
        load_run(_cpu_run(tmp_path / "fp8", "fp8", loads[1], 2.0)),
    ]
    comparison = compare_runs(runs)
    (line,) = comparison.verdicts
    assert expected in line, line
    (entry,) = runs_verdict(comparison, 1.0)["verdicts"]
    assert (entry["speedup"] is None) == ("not compared" in expected)
    # the table's speedup column says the same as the verdict: no number beside "not compared"
    table_speedup = comparison.summaries[1].values["speedup"]
    assert math.isnan(table_speedup) == ("not compared" in expected)


def test_report_title_names_the_runs_precisions(tmp_path):
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.report import render_html, render_markdown
    from nemo_fp8_rl.analysis.rundata import load_run

    runs = [load_run(_cpu_run(tmp_path / n, "bf16", 1.0, 1.0)) for n in ("a", "b")]
    comparison = compare_runs(runs)
    assert render_markdown(comparison, {}).startswith("# BF16 runs: comparison\n")
    assert "<h1>BF16 runs: comparison</h1>" in render_html(comparison, {})


def test_evaluation_section_goes_into_both_reports(tmp_path):
    from nemo_fp8_rl.cli.compare import add_to_reports

    (tmp_path / "report.md").write_text("# r\n")
    (tmp_path / "report.html").write_text("<html><body><h1>r</h1></body></html>\n")
    add_to_reports(tmp_path, "## Evaluation: addition\n", "<h2>Evaluation: addition</h2>")
    assert (tmp_path / "report.md").read_text() == "# r\n\n## Evaluation: addition\n"
    page = (tmp_path / "report.html").read_text()
    assert "<h1>r</h1><h2>Evaluation: addition</h2>\n</body>" in page


def test_a_comparison_without_plots_keeps_the_earlier_plots(tmp_path):
    import json

    from nemo_fp8_rl.analysis.report_folder import claim

    out = tmp_path / "cmp"
    folder = claim(out, "runs", ["a", "b"])
    (out / "reward.png").write_bytes(b"png")
    (out / "report.md").write_text("1")
    folder.record()
    claim(out, "runs", ["a", "b"], keep_plots=True).record()  # --no-plots, same inputs
    assert (out / "reward.png").read_bytes() == b"png" and not (out / "report.md").exists()
    assert json.loads((out / "inputs.json").read_text())["files"] == ["reward.png"]
    claim(out, "runs", ["a", "b"]).record()  # with plots: the old ones are replaced
    assert not (out / "reward.png").exists()


def test_more_seeds_advice_can_be_pasted(tmp_path, monkeypatch, capsys):
    from nemo_fp8_rl.analysis.more_seeds import more_seeds_commands
    from nemo_fp8_rl.config.commands import command

    monkeypatch.chdir(tmp_path)
    Workspace(tmp_path, lambda: tmp_path).run("runs/grpo-tiny-qwen3-cpu-bf16")  # the single run
    first, *_, last = more_seeds_commands(["grpo-tiny-qwen3-cpu-bf16", "grpo-tiny-qwen3-cpu-fp8"])
    assert last == (
        f"{command('compare')} runs/grpo-tiny-qwen3-cpu-bf16-seeds runs/grpo-tiny-qwen3-cpu-fp8-seeds"
    )
    argv = first.removeprefix(command("train")).split()
    assert invoke(train.main, [*argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert "seed-1" in capsys.readouterr().out


def _trained_run(root: Path) -> tuple[Path, dict]:
    """A run folder as the embedded engine leaves it: model/ (the start) and one checkpoint
    whose trained weights are the start's plus 1."""
    import torch
    from catalogue_cases import write_tiny_hf
    from safetensors.torch import load_file

    from nemo_fp8_rl.engines.local import checkpoint as ckpt

    run = root / "run"
    model = write_tiny_hf(run / "model")
    (run / "recipe.yaml").write_text("grpo: {seed: 1}\n")
    trained = {k: v.float() + 1.0 for k, v in load_file(str(model / "model.safetensors")).items()}
    state = {"trainer": {"model": trained}, "rng": torch.get_rng_state()}
    ckpt.save_checkpoint(run / "checkpoints", 1, state, {"recipe": "run"})
    return run, trained


@pytest.mark.parametrize("which", ["run-folder", "checkpoint"])
def test_refit_export_of_a_trained_checkpoint(tmp_path, which, capsys):
    import torch
    from safetensors.torch import load_file

    run, trained = _trained_run(tmp_path)
    src = run if which == "run-folder" else run / "checkpoints" / "step_1"
    out = tmp_path / "fp8"
    assert invoke(refit.main, ["export", str(src), str(out)]) == 0, capsys.readouterr().err
    (shard,) = out.glob("*.safetensors")
    exported = load_file(str(shard))
    norm = "model.norm.weight"  # kept in BF16 by the export: the trained value, not the start
    assert torch.equal(exported[norm], trained[norm].to(torch.bfloat16))
    assert "weight_scale_inv" in " ".join(exported)  # and the linear layers in FP8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8", "run"]  # no temporary left


def test_refit_export_refuses_a_bad_source_before_importing_torch(tmp_path):
    code = (
        "import sys; from nemo_fp8_rl.cli import refit; from nemo_fp8_rl.cli.common import invoke;"
        f"rc = invoke(refit.main, ['export', {str(tmp_path / 'nope')!r}, {str(tmp_path / 'o')!r}]);"
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "nope: no such file or folder. Fix: pass a Hugging Face checkpoint folder" in done.stderr


def test_a_run_keeps_its_color_and_the_legend_covers_no_panel():
    import numpy as np

    from nemo_fp8_rl.analysis.report import Curve, PlotSpec, draw_plot

    spec = PlotSpec("bounds", "bounds", (("train/calib_low", "L"), ("train/calib_high", "H")))
    steps = np.arange(1, 4)
    panels = [[Curve("b", steps, np.ones(3))], [Curve("a", steps, np.ones(3)),
                                                 Curve("b", steps, np.ones(3))]]  # fmt: skip
    fig = draw_plot(spec, panels, names=["a", "b"])
    left, right = fig.axes
    assert left.get_lines()[0].get_color() == right.get_lines()[1].get_color() == "C1"
    assert left.get_legend() is None and right.get_legend() is None
    (legend,) = fig.legends  # one, below the panels
    assert [t.get_text() for t in legend.get_texts()] == ["b", "a"]
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.y1 <= ax.get_window_extent().y0 for ax in fig.axes)


def test_study_plots_draw_t_interval_bands_in_one_color_per_recipe():
    import numpy as np
    from matplotlib.figure import Figure

    from nemo_fp8_rl.analysis.stats import band
    from nemo_fp8_rl.study import report

    grid = np.array([[0.4, 0.4, 0.5], [0.6, 0.2, 0.1], [0.5, 0.3, 0.3]])
    ax = Figure().subplots()
    report.draw_recipe(ax, [0, 1, 2], grid, "b", ["a", "b"])
    (line,) = ax.get_lines()
    assert line.get_color() == "C1" and "(3 seeds, mean, band: 95 % Student-t interval)" in (
        line.get_label()
    )
    _, low, high = band(grid)
    (poly,) = ax.collections
    ys = poly.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(low.min()) and ys.max() == pytest.approx(high.max())
    assert low.min() < grid.min()  # wider than min-max with three seeds: not the old band
