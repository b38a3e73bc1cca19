"""Evaluation pieces without a model: checkpoint selection, suites, NeMo RL eval configs, tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nemo_fp8_rl.analysis import stats
from nemo_fp8_rl.evals import checkpoints, nemo, table
from nemo_fp8_rl.evals.results import BenchmarkScore, EvalResult, write_result
from nemo_fp8_rl.evals.suites import (
    ADDITION,
    MATH8,
    SuiteError,
    get_suite,
    missing_in_nemo_rl,
    nemo_dataset,
)


def _local_ckpts(root, scores):
    for step, acc in scores.items():
        d = root / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "state.pt").write_bytes(b"")
        (d / "info.json").write_text(json.dumps({"step": step, "validation/accuracy": acc}))


def test_local_selection_last_best_step(tmp_path):
    _local_ckpts(tmp_path, {10: 0.4, 20: 0.6, 30: 0.6, 40: 0.5})
    assert checkpoints.select_local(tmp_path, "last").step == 40
    best = checkpoints.select_local(tmp_path, "best")
    assert (best.step, best.value, best.candidates) == (30, 0.6, 4)  # ties: the later step
    assert "biased upward" in best.bias and "4 kept checkpoint(s)" in best.bias
    assert checkpoints.select_local(tmp_path, "step_20").path.name == "step_20"
    with pytest.raises(
        checkpoints.CheckpointError, match="has: step_10, step_20, step_30, step_40"
    ):
        checkpoints.select_local(tmp_path, "step_25")
    with pytest.raises(checkpoints.CheckpointError, match="expected last, best or step_N"):
        checkpoints.select_local(tmp_path, "latest")


def test_best_without_the_metric_says_how_to_fix(tmp_path):
    _local_ckpts(tmp_path, {10: None})
    with pytest.raises(checkpoints.CheckpointError, match="use --checkpoint last"):
        checkpoints.select_local(tmp_path, "best")


def test_nemo_selection_and_megatron_weights(tmp_path):
    for step, acc in {20: 0.3, 40: 0.35}.items():
        d = tmp_path / "checkpoints" / f"step_{step}"
        (d / "policy" / "weights" / "iter_0000040").mkdir(parents=True)
        (d / "training_info.json").write_text(json.dumps({"val:accuracy": acc}))
    cfg = {"metric_name": "val:accuracy", "higher_is_better": True, "keep_top_k": 3}
    sel = checkpoints.select_nemo(tmp_path, "best", cfg)
    assert sel.step == 40 and sel.metric == "val:accuracy"
    assert checkpoints.megatron_weights(sel.path).name == "iter_0000040"
    with pytest.raises(checkpoints.CheckpointError, match="no iter_"):
        checkpoints.megatron_weights(tmp_path)


def test_suites():
    assert get_suite(None, "local") is ADDITION and get_suite(None, "nemo") is MATH8
    with pytest.raises(SuiteError, match="unknown suite"):
        get_suite("gsm8k", "nemo")
    assert missing_in_nemo_rl(MATH8) == {
        "v0.7.0": ["amc23", "amc24", "gaokao2023en", "minerva", "olympiadbench"],
        "7ea279a": ["amc23", "amc24", "gaokao2023en", "minerva", "olympiadbench"],
    }


def _tree(tmp_path, new_style: bool):
    (tmp_path / "examples" / "configs" / "evals").mkdir(parents=True)
    (tmp_path / "examples" / "converters").mkdir()
    text = "load_response_dataset(data_config)" if new_style else "load_eval_dataset(data_config)"
    (tmp_path / "examples" / "run_eval.py").write_text(text)
    (tmp_path / "examples" / "converters" / "convert_megatron_to_hf.py").write_text("")
    (tmp_path / "examples" / "configs" / "evals" / "eval.yaml").write_text("")
    return tmp_path


@pytest.mark.parametrize(("new_style", "aime"), [(False, "aime2024"), (True, "AIME2024")])
def test_eval_config_per_snapshot(tmp_path, new_style, aime, monkeypatch):
    from nemo_fp8_rl.config import load_recipe

    tree = _tree(tmp_path / "tree", new_style)
    monkeypatch.setenv("NEMO_RL_SRC", str(tree))
    assert nemo.nemo_rl_tree() == tree
    run_cfg = load_recipe(
        "paper-fp8-rl/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-8k-fp8-blockwise"
    ).config
    aime24, amc23 = MATH8.benchmarks[0], MATH8.benchmarks[2]
    assert nemo_dataset(aime24, tree) == aime
    cfg = nemo.eval_config(tree, run_cfg, tmp_path / "hf", MATH8, aime24, tmp_path / "out")
    assert cfg["defaults"] == str(tree / "examples/configs/evals/eval.yaml")
    assert cfg["eval"] == {
        "metric": "pass@k",
        "k_value": 1,
        "num_tests_per_prompt": 16,
        "seed": 42,
        "save_path": str(tmp_path / "out"),
    }
    gen = cfg["generation"]
    assert (gen["temperature"], gen["top_p"], gen["top_k"], gen["max_new_tokens"]) == (
        0.6,
        0.95,
        -1,
        8192,
    )
    assert gen["vllm_cfg"]["max_model_len"] == 9216 and gen["vllm_cfg"]["precision"] == "bfloat16"
    assert cfg["data"]["prompt_file"] == str(tree / "examples/prompts/cot.txt")
    assert nemo.eval_config(tree, run_cfg, tmp_path / "hf", MATH8, amc23, tmp_path / "o") is None
    data = tmp_path / "data"
    data.mkdir()
    (data / "amc23.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    local = nemo.eval_config(tree, run_cfg, tmp_path / "hf", MATH8, amc23, tmp_path / "o", data)
    assert local["data"]["dataset_name"] == str(data / "amc23.jsonl")
    assert local["data"]["file_format"] == "json" and local["data"]["problem_key"] == "problem"


def test_convert_command(tmp_path):
    tree = _tree(tmp_path / "tree", True)
    ckpt = tmp_path / "step_40"
    (ckpt / "policy" / "weights" / "iter_0000040").mkdir(parents=True)
    cmd = nemo.convert_command(tree, ckpt, tmp_path / "hf", "Qwen/Qwen3-8B-Base")
    # no launcher in the stand-in tree's converter: NeMo RL's documented one, mcore extra
    assert cmd[:6] == [*nemo.CONVERT_LAUNCHER, "examples/converters/convert_megatron_to_hf.py"]
    assert cmd[6:] == [
        "--config",
        str(ckpt / "config.yaml"),
        "--hf-model-name",
        "Qwen/Qwen3-8B-Base",
        "--megatron-ckpt-path",
        str(ckpt / "policy/weights/iter_0000040"),
        "--hf-ckpt-path",
        str(tmp_path / "hf"),
    ]


def test_read_scores_is_the_mean_reward(tmp_path):
    rows = [{"reward": r} for r in (1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0)]
    (tmp_path / "evaluation_data.json").write_text(json.dumps({"evaluation_data": rows}))
    assert nemo.read_scores(tmp_path, 4) == (0.5, 2, [2, 2])  # correct samples per problem


def _result(run_dir, recipe, precision, seed, selector, scores):
    benches = {k: BenchmarkScore(k, v, 30, 16, k) for k, v in scores.items()}
    ckpt = {"selector": selector, "step": 100}
    write_result(
        EvalResult(
            "math8",
            run_dir.name,
            recipe,
            seed,
            precision,
            "nemo",
            ckpt,
            {},
            benches,
            {"amc23": "not in NeMo RL"},
        ),
        run_dir,
    )


def test_table_over_seeds(tmp_path):
    arms = {"bf16": [0.50, 0.54, 0.58], "fp8": [0.40, 0.42, 0.47]}
    dirs = []
    for arm, values in arms.items():
        for seed, v in enumerate(values):
            d = tmp_path / f"{arm}-s{seed}"
            _result(d, f"r-{arm}", arm, seed, "last", {"aime24": v, "math500": v + 0.2})
            _result(d, f"r-{arm}", arm, seed, "best", {"aime24": v + 0.05, "math500": v + 0.25})
            dirs.append(d)
    (t,) = table.collect(dirs)
    assert t.benchmarks == ["aime24", "math500"] and t.arms[t.reference].recipe == "r-bf16"
    headers, rows = table.rows(t)
    assert headers[-2:] == ["average", "vs BF16"]
    by = {(r[0], r[2]): r for r in rows}
    mean = 100 * np.mean(arms["fp8"])
    ci = stats.mean_interval(arms["fp8"])
    lo, hi = ci.low, ci.high
    assert by[("r-fp8", "last")][5] == f"{mean:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] (n={ci.n})"
    assert 100 * lo <= mean <= 100 * hi
    delta = 100 * (np.mean(arms["fp8"]) - np.mean(arms["bf16"]))
    assert by[("r-fp8", "last")][-1].startswith(f"{delta:+.1f} [")
    # the same seeds ran in both arms: the difference is paired by seed
    d = {s: arms["fp8"][i] - arms["bf16"][i] for i, s in enumerate(range(len(arms["fp8"])))}
    paired = stats.mean_interval(list(d.values())).scaled(100)
    assert by[("r-fp8", "last")][-1] == (
        f"{delta:+.1f} [{paired.low:+.1f}, {paired.high:+.1f}] (n={paired.n}, paired)"
    )
    assert by[("r-bf16", "best")][3] == "3"
    md = table.markdown([t])
    assert "missing amc23: not in NeMo RL" in md and "One seed per run" not in md


def test_one_seed_cells_have_no_interval():
    assert table._cell([0.5]) == "50.0"
    lo_hi = table._cell([0.2, 0.4, 0.6, 0.8])
    lo, hi = (float(x) for x in lo_hi.split("[")[1].split("]")[0].split(","))
    assert lo < 50 < hi and lo_hi.endswith("(n=4)")  # t: wider than the values' range
    half = 100 * stats.t_quantile(0.95, 3) * np.std([0.2, 0.4, 0.6, 0.8], ddof=1) / 2
    assert (lo, hi) == pytest.approx((50 - half, 50 + half), abs=0.06)
