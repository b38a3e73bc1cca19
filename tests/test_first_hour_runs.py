"""The first hour with runs: evaluating a run of NeMo RL's loop on CPU, seed groups whose
recipes differ outside precision, the more-seeds hint for NeMo RL runs, two surge rules with
two names, and plots that do not mislead.

A run of NeMo RL's loop on CPU is laid out here as that loop leaves it: `nemo-inputs/` written by
the real hand-over (`tiny.handover.prepare`: the warm-started tiny model and the
problems), and NeMo RL checkpoints whose `policy/weights/model.pt` holds the CPU Megatron
worker's state dict, built from the model's weights by the worker's own conversion
(`engines.nemo.cpu.megatron_model.hf_to_megatron`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config import load_recipe

NEMO_RECIPE = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8"


@pytest.fixture(scope="module")
def nemo_cpu_run(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A run of NeMo RL's loop on CPU with checkpoints at steps 5 (the start's weights) and 10
    (the start's plus 0.01: the "trained" weights), ranked by NeMo RL's `val:accuracy`."""
    from transformers import AutoConfig

    from nemo_fp8_rl.engines.nemo.cpu.megatron_model import hf_to_megatron, read_hf_state
    from nemo_fp8_rl.tiny import handover as tiny_handover

    root = tmp_path_factory.mktemp("nemo-cpu")
    # the tiny default's validation size, whose warm-up is shipped (the NeMo recipe's 64 would
    # train one here, minutes on a loaded machine)
    recipe = load_recipe(NEMO_RECIPE, ["local.task.num_validation=256"])
    run = root / "runs" / recipe.name
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe.config))
    (run / "environment.json").write_text(
        json.dumps(
            {"engine": "nemo", "placement": "cpu", "nemo_rl_location": "/opt/nemo-rl/nemo_rl"}
        )
    )
    inputs = tiny_handover.prepare(recipe.config, run)
    hf = AutoConfig.from_pretrained(inputs["model"])
    start = read_hf_state(inputs["model"])
    trained = {k: v + 0.01 for k, v in start.items()}
    for step, weights, score in ((5, start, 0.30), (10, trained, 0.25)):
        ckpt = run / "checkpoints" / f"step_{step}"
        (ckpt / "policy" / "weights").mkdir(parents=True)
        torch.save(hf_to_megatron(weights, hf), ckpt / "policy" / "weights" / "model.pt")
        info = {"current_step": step, "val:accuracy": score}
        (ckpt / "training_info.json").write_text(json.dumps(info))
    records = [{"step": 0, "validation/accuracy": 0.2}, {"step": 3, "validation/accuracy": 0.4},
               {"step": 5, "validation/accuracy": 0.3}, {"step": 10, "validation/accuracy": 0.25}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run, trained


def test_eval_reads_the_megatron_weights_of_a_nemo_cpu_run(nemo_cpu_run):
    from nemo_fp8_rl.evals import local
    from nemo_fp8_rl.evals.request import check_request

    run, trained = nemo_cpu_run
    request = check_request(run, "last", None, None)
    assert (request.selection.step, request.suite.name) == (10, "addition")
    model, _ = local.load_policy(run, request.config, request.selection)
    state = model.state_dict()
    for name, tensor in trained.items():
        assert torch.equal(state[name], tensor.to(torch.bfloat16)), name
    start = check_request(run, "step_0", None, None).selection
    assert start.path == run / "nemo-inputs" / "model"


def test_eval_command_scores_a_nemo_cpu_run_and_says_how_best_was_chosen(nemo_cpu_run, capsys):
    from nemo_fp8_rl.cli import eval as eval_cli

    run, _ = nemo_cpu_run
    argv = ["--run", str(run), "--checkpoint", "best", "--num-problems", "4"]
    assert invoke(eval_cli.main, argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "best = step_5: the highest val:accuracy among the 2 kept checkpoint(s)" in out
    assert "the run's best validation (validation/accuracy) was 0.400 at step 3, not kept" in out
    result = json.loads((run / "eval" / "addition.best.json").read_text())
    assert result["checkpoint"]["step"] == 5 and result["engine"] == "local"
    from nemo_fp8_rl.evals import nemo_cpu

    inputs = run / "nemo-inputs"
    trained_on = {json.loads(x)["input"] for f in ("train", "validation")
                  for x in (inputs / f"{f}.jsonl").read_text().splitlines()}  # fmt: skip
    assert nemo_cpu.seen_prompts(run) == trained_on  # what the held-out draw leaves out


def test_more_seeds_of_a_nemo_cpu_run_stay_on_nemo_rl(nemo_cpu_run):
    from nemo_fp8_rl.analysis.more_seeds import more_seeds_commands
    from nemo_fp8_rl.analysis.rundata import load_run

    run, _ = nemo_cpu_run
    first, last = more_seeds_commands([run.name], [load_run(run)])
    assert (
        first.startswith("bash ") and "scripts/nemo-rl-env.sh /opt/nemo-rl -- python -m " in first
    )
    assert first.endswith("--engine nemo") and f"--recipe {run.name} --seeds 1-3" in first
    assert last.endswith(f"compare runs/{run.name}-seeds")


# ---- seed groups whose recipes differ outside precision ----------------------------------------


def test_seed_groups_of_different_recipes_are_diffed_and_warned(tmp_path, capsys):
    from test_groups import write_seed_run

    from nemo_fp8_rl.analysis.groups import compare_groups
    from nemo_fp8_rl.analysis.rundata import load_run
    from nemo_fp8_rl.cli.compare import expand_seed_groups
    from nemo_fp8_rl.cli.compare import main as compare_main

    for seed in (1, 2):
        write_seed_run(tmp_path, "bf16-10", seed, fp8=False, acc=0.5, clip=0.01)
        run = write_seed_run(tmp_path, "fp8-150", seed, fp8=True, acc=0.5, clip=0.02)
        config = yaml.safe_load((run / "recipe.yaml").read_text())
        config["grpo"]["max_num_steps"] = 150
        (run / "recipe.yaml").write_text(yaml.safe_dump(config))
    runs = [load_run(p) for p in expand_seed_groups([str(tmp_path / "bf16-10"),
                                                     str(tmp_path / "fp8-150")])]  # fmt: skip
    diff = compare_groups(runs).recipe_diff
    assert [e.key for e in diff.entries if e.group == "other"] == ["grpo.max_num_steps"]
    assert "grpo.seed" not in {e.key for e in diff.entries}
    assert diff.warnings and "not a fair precision comparison" in diff.warnings[0]
    out = tmp_path / "cmp"
    argv = [str(tmp_path / "bf16-10"), str(tmp_path / "fp8-150"), "--out", str(out), "--no-plots"]
    assert invoke(compare_main, argv) == 2  # refused: the recipes differ in more than precision
    refused = capsys.readouterr().err
    assert (
        "recipe key grpo.max_num_steps 150 here, 20 in" in refused and "--allow-unfair" in refused
    )
    assert invoke(compare_main, [*argv, "--allow-unfair"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "warning not a fair precision comparison" in printed and "grpo.max_num_steps" in printed
    assert "NOT A PRECISION COMPARISON (differs from bf16-10/seed-1" in printed
    report = (out / "report.md").read_text()
    assert "## Recipe differences: bf16-10 vs fp8-150" in report and "> **Warning:**" in report
    assert "Warning: not a fair precision comparison" in (out / "report.html").read_text()


# ---- surges: two rules, two names --------------------------------------------------------------


def test_compare_and_the_run_note_name_their_surge_rules():
    from nemo_fp8_rl.analysis.surge import RULE, detect_entropy_surges
    from nemo_fp8_rl.study import endpoints
    from nemo_fp8_rl.study.run_note import run_note

    # a slow climb: the study's statistic crosses 0.1 nats, the z-score detector sees no step
    entropy = [0.5 + 0.006 * s for s in range(40)]
    assert detect_entropy_surges(range(40), entropy) == []
    rise = endpoints.largest_rise(entropy, endpoints.load().entropy_surge.window)
    assert rise >= endpoints.load().entropy_surge.threshold
    note = "\n".join(run_note([{"step": s, "train/entropy": e} for s, e in enumerate(entropy, 1)]))
    assert f"entropy surge onsets ({RULE}): none" in note  # one run's surge: compare's rule
    assert "largest rise above the trailing 20-step minimum" in note  # the study's, not judged
    assert "threshold" not in note
    assert RULE.startswith("z-score detector: entropy ≥ 3 SD and ≥ 0.05 nats")


# ---- plots -------------------------------------------------------------------------------------


def _cpu_runs(tmp_path: Path, loads: tuple[float | None, float | None], bf16_score: bool):
    from test_first_hour import _cpu_run

    from nemo_fp8_rl.analysis.rundata import load_run

    runs = []
    for name, load in zip(("bf16", "fp8"), loads, strict=True):
        run_dir = _cpu_run(tmp_path / name, name, load, 1.0)
        if bf16_score:
            with (run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"step": 10, "validation/bf16_accuracy": 0.4}) + "\n")
        runs.append(load_run(run_dir))
    return runs


@pytest.mark.parametrize("loads, step_time", [((1.0, None), False), ((2.0, 2.1), True)])
def test_step_time_is_drawn_only_when_speed_is_compared(tmp_path, loads, step_time):
    from nemo_fp8_rl.analysis.compare import compare_runs
    from nemo_fp8_rl.analysis.report import write_plots

    comparison = compare_runs(_cpu_runs(tmp_path, loads, False))
    (tmp_path / "plots").mkdir()
    drawn = write_plots(comparison, tmp_path / "plots")
    assert ("step_time" in drawn) is step_time
    assert "reward_accuracy" in drawn


@pytest.mark.parametrize(
    "bf16_score, label",
    [(False, "(rollout precision: FP8 for FP8 runs)"), (True, "(BF16-scored)")],
)
def test_the_accuracy_axis_says_how_runs_were_scored(tmp_path, bf16_score, label):
    from nemo_fp8_rl.analysis.report import plot_specs
    from nemo_fp8_rl.runs import scores

    specs = {s.name: s for s in plot_specs(_cpu_runs(tmp_path, (1.0, 1.0), bf16_score), True)}
    axis = dict(specs["reward_accuracy"].panels)[scores.BF16_ACCURACY]
    assert axis.endswith(label)


def test_titles_fit_and_accuracy_shows_the_whole_range():
    from nemo_fp8_rl.analysis.report import PLOTS, Curve, draw_plot

    steps = np.arange(1, 21)
    for spec in PLOTS:
        panels = [
            [Curve("a run with a long name", steps, 0.30 + 0.002 * steps)] for _ in spec.panels
        ]
        fig = draw_plot(spec, panels, {"a run with a long name": 5})
        fig.canvas.draw()
        box, title = fig.bbox, fig._suptitle.get_window_extent()
        assert box.x0 <= title.x0 and title.x1 <= box.x1, (spec.name, title, box)
        for ax, (metric, _) in zip(fig.axes, spec.panels, strict=True):
            if metric in ("train/reward", "validation/bf16_accuracy"):
                assert ax.get_ylim() == pytest.approx((-0.02, 1.02)), spec.name


def test_study_plots_have_titles_and_the_compounding_its_reference_lines():
    from nemo_fp8_rl.study import report

    grid = np.array([[0.9, 1.0, 1.1], [1.0, 1.05, 0.95]])
    names = ["grpo-study-fp8-uncalibrated"]
    for key, label, _, title in report.SERIES:
        fig = report.study_figure(key, label, title, {names[0]: ([1, 2, 3], grid)}, names)
        (ax,) = fig.axes
        assert ax.get_title() == title
        levels = sorted(line.get_ydata()[0] for line in ax.get_lines()[1:])
        if key == "train/ratio_compounding":
            assert levels == pytest.approx([1.0, 2**0.5])
        if key == "validation/accuracy":
            assert ax.get_ylim() == (0.0, 1.0)


def test_more_seeds_of_a_copied_recipe_name_its_file(tmp_path, monkeypatch, capsys):
    """A run of a copy (`recipes cp ... my-fp8.yaml`, trained from its folder) is named after
    the file, which is no recipe name: the hint names the file, and it trains as pasted."""
    from nemo_fp8_rl.analysis.more_seeds import more_seeds_commands
    from nemo_fp8_rl.cli import recipes, train
    from nemo_fp8_rl.config.commands import command

    monkeypatch.chdir(tmp_path)
    assert invoke(recipes.main, ["cp", "tiny/grpo-tiny-qwen3-cpu-fp8", "my-fp8.yaml"]) == 0
    first, *_ = more_seeds_commands(["my-fp8"])
    assert "--recipe my-fp8.yaml --seeds 1-3" in first
    assert invoke(train.main, [*first.removeprefix(command("train")).split(), "--dry-run"]) == 0
    assert "seed-1" in capsys.readouterr().out
    assert "<the recipe file of gone>" in more_seeds_commands(["gone"])[0]
