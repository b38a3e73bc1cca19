"""End to end on CPU: train the tiny BF16 and FP8 recipes for two steps, evaluate their last and
best checkpoints with `nemo_fp8_rl.eval`, and compare the evaluations."""

from __future__ import annotations

import json

import pytest

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.compare import main as compare_main
from nemo_fp8_rl.cli.eval import main as eval_main
from nemo_fp8_rl.cli.eval import read_run_config
from nemo_fp8_rl.evals import local
from nemo_fp8_rl.evals.suites import ADDITION

pytestmark = pytest.mark.slow

FAST = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=8",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "grpo.val_period=1",
    "checkpointing.save_period=1",
    "local.warmup.steps=20",
    "local.warmup.target_accuracy=null",
    "local.task.num_validation=16",
    "loss_fn.calibration.interval=1",
    "loss_fn.calibration.min_tokens=4",
    "local.progress=false",
]
PROBLEMS = 32


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run directories of the tiny BF16 and FP8 (blockwise, calibrated) recipes, evaluated."""
    ray = pytest.importorskip("ray")
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.engines.local import run

    mp = pytest.MonkeyPatch()
    mp.setenv("NEMO_FP8_RL_CACHE", str(tmp_path_factory.mktemp("cache")))
    root = tmp_path_factory.mktemp("runs")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        dirs = [
            run(
                load_recipe(f"tiny/grpo-tiny-qwen3-cpu-{v}", FAST, run_dir=root / v), progress=False
            )
            for v in ("bf16", "fp8")
        ]
    finally:
        ray.shutdown()
        mp.undo()
    for d in dirs:
        for ckpt in ("last", "best"):
            args = ["--run", str(d), "--checkpoint", ckpt, "--num-problems", str(PROBLEMS)]
            assert eval_main(args) == 0
    return dirs


def test_result_file_format(runs):
    for d in runs:
        last = json.loads((d / "eval" / "addition.last.json").read_text())
        best = json.loads((d / "eval" / "addition.best.json").read_text())
        assert json.loads((d / "eval" / "addition.json").read_text()) == best  # the latest written
        assert last["run"] == d.name and last["engine"] == "local" and last["seed"] == 1
        assert last["precision"] == d.name and last["recipe"] == f"grpo-tiny-qwen3-cpu-{d.name}"
        assert last["checkpoint"]["step"] == 2 and last["checkpoint"]["selection_bias"] is None
        assert set(last["benchmarks"]) == {"add2-heldout", "add3"}
        for b in last["benchmarks"].values():
            assert b["num_problems"] == PROBLEMS and b["samples_per_problem"] == 4
            assert b["metric"] == "avg@4" and 0.0 <= b["score"] <= 1.0
        scores = [b["score"] for b in last["benchmarks"].values()]
        assert last["average"] == pytest.approx(sum(scores) / 2)
        assert last["sampling"]["temperature"] == 0.6 and last["sampling"]["top_p"] == 0.95
        # best: the highest validation accuracy among the kept checkpoints, bias stated
        by_step = {int(k): v for k, v in best["checkpoint"]["validation_by_step"].items()}
        top = max(by_step.values())
        assert best["checkpoint"]["step"] == max(s for s, v in by_step.items() if v == top)
        assert "biased upward" in best["checkpoint"]["selection_bias"]


def test_heldout_problems_were_not_trained_on_and_add3_is_harder(runs):
    config = read_run_config(runs[0])
    seen = local.seen_prompts(config)
    add2, add3 = ADDITION.benchmarks
    prompts, answers = local.problems(add2, PROBLEMS, seen)
    assert not set(prompts) & seen and len(set(prompts)) == PROBLEMS
    assert all(
        str(sum(map(int, p[:-1].split("+")))) == a for p, a in zip(prompts, answers, strict=True)
    )
    three, _ = local.problems(add3, PROBLEMS, set())
    assert max(max(map(int, p[:-1].split("+"))) for p in three) >= 100


def test_eval_errors_name_what_exists(runs, capsys):
    """As the console script reports them (`invoke` prints the error line, exit code 2)."""
    assert invoke(eval_main, ["--run", str(runs[0]), "--checkpoint", "step_99"]) == 2
    assert "has no step_99 (has: step_1, step_2)" in capsys.readouterr().err
    assert invoke(eval_main, ["--run", str(runs[0]), "--suite", "math8"]) == 2
    assert "Fix: use --suite addition" in capsys.readouterr().err
    assert invoke(eval_main, ["--run", str(runs[0].parent / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_compare_reads_the_evaluations(runs, tmp_path, capsys):
    assert compare_main([str(d) for d in runs] + ["--out", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "evaluation: addition" in out
    md = (tmp_path / "evaluation.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| grpo-tiny")]
    assert [r.split(" | ")[2] for r in rows] == ["last", "best", "last", "best"]
    fp8_last = json.loads((runs[1] / "eval" / "addition.last.json").read_text())
    assert f"{100 * fp8_last['average']:.1f}" in rows[2]
    assert "One seed per run" in md and "biased upward" in md


def test_pass_at_k_with_more_samples(runs):
    """`--samples 8 --pass-k 1,4,8`: pass@1 is avg@8, pass@8 the share of problems solved."""
    d = runs[1]
    args = ["--run", str(d), "--checkpoint", "step_2", "--num-problems", "16"]
    assert eval_main([*args, "--samples", "8", "--pass-k", "1,4,8"]) == 0
    result = json.loads((d / "eval" / "addition.step_2.json").read_text())
    for b in result["benchmarks"].values():
        correct, p = b["correct_per_problem"], b["pass_at_k"]
        assert len(correct) == 16 and all(0 <= c <= 8 for c in correct)
        assert p["1"] == pytest.approx(b["score"]) and p["1"] <= p["4"] <= p["8"]
        assert p["8"] == pytest.approx(sum(c > 0 for c in correct) / 16)
