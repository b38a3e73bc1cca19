"""Catalogue cases for the commands that write or read results: `compare` folders and verdicts,
`refit export` sources, `eval` arguments and `submit --eval`/`--nodes`/`slurm.env`.

Same `Case` format as `catalogue_cases` (run by `test_catalogue_report.py` with the harness of
`test_catalogue.py`); `command` may also be `eval`.
"""

from __future__ import annotations

import json
from pathlib import Path

from catalogue_cases import QWEN, Case, Workspace

from nemo_fp8_rl.cli import compare
from nemo_fp8_rl.cli.common import invoke

T = "tiny/grpo-tiny-qwen3-cpu-bf16"
Q = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
RUNS = ("{ws}/bf16", "{ws}/fp8")
EXPORT = ("export", "{ws}/src", "{ws}/out")
EVAL = ("--run", "{ws}/run")


# ---- compare ----------------------------------------------------------------------------------


def _compare_runs(ws: Workspace) -> None:
    """A BF16 and an FP8 run, written by the embedded engine's metrics logger."""
    from test_compare import write_project_run

    write_project_run(ws.root / "bf16", 10, precision="bf16", acc_final=0.6, step_s=2.0)
    write_project_run(ws.root / "fp8", 10, precision="fp8", acc_final=0.6, step_s=1.5)


def _three_runs(ws: Workspace) -> None:
    from test_compare import write_project_run

    _compare_runs(ws)
    write_project_run(ws.root / "fp8b", 10, precision="fp8", acc_final=0.5, step_s=1.4)


def _compared(ws: Workspace, *argv: str) -> None:
    """Setup: a real earlier comparison written by `compare` itself."""
    code = invoke(compare.main, [a.replace("{ws}", str(ws.root)) for a in argv], "compare")
    assert code == 0


def _other_comparison(ws: Workspace) -> None:
    _three_runs(ws)
    _compared(ws, *RUNS, "--out", "{ws}/rep", "--no-plots")


def _same_comparison(ws: Workspace) -> None:
    _compare_runs(ws)
    _compared(ws, *RUNS, "--out", "{ws}/rep", "--no-plots")


def _hand_written_report(ws: Workspace) -> None:
    _compare_runs(ws)
    ws.write("rep/report.md", "# my notes on these runs\n")


def nan_runs(ws: Workspace) -> None:
    """An FP8 run whose timings are all NaN (a broken timer) and whose reward has NaN points."""
    from test_compare import write_project_run

    write_project_run(ws.root / "bf16", 10, precision="bf16", acc_final=0.6, step_s=2.0)
    fp8 = write_project_run(
        ws.root / "fp8", 10, precision="fp8", acc_final=0.6, step_s=float("nan")
    )
    lines = (fp8 / "metrics.jsonl").read_text().splitlines()
    for i in (2, 5):
        record = json.loads(lines[i])
        record["train/reward"] = float("inf") if i == 2 else float("nan")
        lines[i] = json.dumps(record)
    (fp8 / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _eval_scalar(ws: Workspace) -> None:
    _compare_runs(ws)
    ws.write("bf16/eval/addition.last.json", "5\n")


# ---- refit export -----------------------------------------------------------------------------


def _sharded(ws: Workspace, drop: str | None = None) -> Path:
    """The tiny checkpoint as two shards with an index, as transformers saves a large model."""
    from safetensors.torch import load_file, save_file

    src = ws.hf("src")
    tensors = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    weight_map = {n: names[1] if ".layers.2." in n else names[0] for n in tensors}
    for shard in names:
        part = {n: t for n, t in tensors.items() if weight_map[n] == shard}
        save_file(part, src / shard, metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (src / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if drop:
        (src / drop).unlink()
    return src


def _mislabel_index(src: Path) -> None:
    """The index places one tensor of shard 2 in shard 1 (an index from another download)."""
    path = src / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"]["model.layers.2.mlp.down_proj.weight"] = "model-00001-of-00002.safetensors"
    path.write_text(json.dumps(index))


def _drop_tensor(src: Path, name: str) -> None:
    """The checkpoint without one tensor (a config that says the weights are untied)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    del tensors[name]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def _config_edit(**changes: object):
    def setup(ws: Workspace) -> None:
        path = ws.hf("src") / "config.json"
        config = json.loads(path.read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        path.write_text(json.dumps(config, indent=2))

    return setup


def _gpt2(ws: Workspace) -> None:
    """A real GPT-2 checkpoint (tiny), saved by transformers."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    )
    model.to(torch.bfloat16).save_pretrained(ws.root / "src")


# ---- eval and submit --eval -------------------------------------------------------------------


def _run_with_recipe(text: str):
    def setup(ws: Workspace) -> None:
        (ws.run() / "recipe.yaml").write_text(text)

    return setup


def _gpu_run(ws: Workspace) -> None:
    ws.run(recipe=QWEN)


# One case per line, so the table reads as a table.
# fmt: off
CASES: list[Case] = [
    # ---- compare: folders that hold something else, values that mean nothing ----------------
    Case("compare-out-hand-written-report", "compare", (*RUNS, "--out", "{ws}/rep", "--no-plots"), 2, "--out {ws}/rep: holds files this comparison did not write (report.md); nothing was written. Fix: give --out a new folder, or add --overwrite", _hand_written_report),
    Case("compare-out-other-comparison", "compare", (*RUNS, "{ws}/fp8b", "--out", "{ws}/rep", "--no-plots"), 2, "holds another comparison (runs of {ws}/bf16, {ws}/fp8", _other_comparison),
    Case("compare-out-other-comparison-overwrite", "compare", (*RUNS, "{ws}/fp8b", "--out", "{ws}/rep", "--no-plots", "--overwrite"), 0, "", _other_comparison, changes=True, stdout="wrote {ws}/rep/report.md"),
    Case("compare-out-same-comparison-again", "compare", (*RUNS, "--out", "{ws}/rep", "--no-plots"), 0, "", _same_comparison, changes=True, stdout="wrote {ws}/rep/report.md"),
    Case("compare-recipes-out-hand-written", "compare", (T, "tiny/grpo-tiny-qwen3-cpu-fp8", "--out", "{ws}/rep"), 2, "holds files this comparison did not write (recipes.md)", lambda ws: ws.write("rep/recipes.md", "mine\n")),
    Case("compare-tolerance-nan", "compare", (*RUNS, "--tolerance-points", "nan"), 2, "--tolerance-points: expected a finite number >= 0, got 'nan'", _compare_runs),
    Case("compare-tolerance-negative", "compare", (*RUNS, "--tolerance-points", "-1"), 2, "expected a finite number >= 0, got '-1'", _compare_runs),
    Case("compare-eval-file-scalar", "compare", (*RUNS, "--no-plots"), 2, "bf16/eval/addition.last.json: not an evaluation result (a JSON int, not an object)", _eval_scalar),
    # ---- refit export: half models, configs that lie, models the bridge does not map ---------
    Case("export-shard-missing", "refit", EXPORT, 1, "model-00002-of-00002.safetensors: missing: model.safetensors.index.json names 2 shard(s) and 1 are absent", lambda ws: _sharded(ws, drop="model-00002-of-00002.safetensors"), subprocess=True),
    Case("export-index-names-absent-tensor", "refit", EXPORT, 1, "places model.layers.2.mlp.down_proj.weight in model-00001-of-00002.safetensors, which does not hold it", lambda ws: _mislabel_index(_sharded(ws))),
    Case("export-sharded-complete", "refit", EXPORT, 0, "", _sharded, changes=True, stdout="12 FP8 weights"),
    Case("export-hidden-size-disagrees", "refit", EXPORT, 2, "config.json: does not describe the tensors: hidden_size is 256 but model.embed_tokens.weight is [128, 128] (hidden_size 128)", _config_edit(hidden_size=256)),
    Case("export-kv-heads-disagree", "refit", EXPORT, 2, "num_key_value_heads * head_dim is 128 but model.layers.0.self_attn.k_proj.weight has 64 rows", _config_edit(num_key_value_heads=4)),
    Case("export-layers-disagree", "refit", EXPORT, 2, "num_hidden_layers is 4 but the tensors hold 3 layers", _config_edit(num_hidden_layers=4)),
    Case("export-intermediate-disagrees", "refit", EXPORT, 2, "intermediate_size is 512 but model.layers.0.mlp.gate_proj.weight has 384 rows", _config_edit(intermediate_size=512)),
    Case("export-vocab-disagrees", "refit", EXPORT, 2, "vocab_size is 32000 but model.embed_tokens.weight is [128, 128]", _config_edit(vocab_size=32000)),
    Case("export-untied-without-lm-head", "refit", EXPORT, 2, "tie_word_embeddings is false but the tensors hold no lm_head.weight", lambda ws: _drop_tensor(ws.hf("src"), "lm_head.weight")),
    Case("export-gpt2", "refit", EXPORT, 2, "architecture GPT2LMHeadModel is not one the refit bridge maps. Fix: export a model of a supported architecture (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)", _gpt2),
    Case("export-no-architecture", "refit", EXPORT, 2, "names no architecture", _config_edit(architectures=None, model_type=None)),
    # ---- eval: the run's recipe, the checkpoint, the arguments, all before any work ----------
    Case("eval-recipe-empty", "eval", EVAL, 2, "run/recipe.yaml: empty: the run's saved recipe is lost", _run_with_recipe(""), subprocess=True),
    Case("eval-recipe-list", "eval", EVAL, 2, "run/recipe.yaml: not a mapping (a list)", _run_with_recipe("- a\n- b\n")),
    Case("eval-recipe-no-cluster", "eval", EVAL, 2, "run/recipe.yaml: has no cluster.gpus_per_node", _run_with_recipe("grpo: {seed: 1}\n")),
    Case("eval-recipe-garbled", "eval", EVAL, 2, "run/recipe.yaml: not a readable recipe", _run_with_recipe("grpo: [1, 2\n")),
    Case("eval-num-problems-zero", "eval", (*EVAL, "--num-problems", "0"), 2, "--num-problems: expected a whole number >= 1, got '0'", lambda ws: ws.run()),
    Case("eval-data-dir-missing-cpu", "eval", (*EVAL, "--data-dir", "{ws}/nonexistent"), 2, "--data-dir {ws}/nonexistent: no such folder", lambda ws: ws.run()),
    Case("eval-data-dir-on-cpu-run", "eval", (*EVAL, "--data-dir", "{ws}/data"), 2, "CPU runs evaluate the addition suite, which reads no data files. Fix: leave --data-dir out", lambda ws: (ws.run(), ws.write("data/amc23.jsonl", "{}\n"))),
    Case("eval-data-dir-missing-gpu", "eval", (*EVAL, "--data-dir", "{ws}/nonexistent"), 2, "--data-dir {ws}/nonexistent: no such folder", _gpu_run, env={"NEMO_RL_SRC": "{ws}/no-nemo-rl"}),
    Case("eval-data-dir-without-benchmarks", "eval", (*EVAL, "--data-dir", "{ws}/data"), 2, "holds none of the files it is for (amc23.jsonl", lambda ws: (_gpu_run(ws), ws.write("data/notes.txt", "x"))),
    Case("eval-checkpoint-info-garbled", "eval", (*EVAL, "--checkpoint", "step_1"), 2, "checkpoints/step_1/info.json: not valid JSON", lambda ws: (ws.run(steps=(1, 2)) / "checkpoints/step_1/info.json").write_text("{garbled")),
    Case("eval-best-with-garbled-info", "eval", (*EVAL, "--checkpoint", "best"), 2, "cannot rank the checkpoints: step_1/info.json is not valid JSON", lambda ws: (ws.run(steps=(1, 2)) / "checkpoints/step_1/info.json").write_text("{garbled")),
    Case("eval-suite-unknown", "eval", (*EVAL, "--suite", "nosuch"), 2, "--suite nosuch: unknown suite. Fix: use one of math8, addition", lambda ws: ws.run()),
    # ---- submit --eval: the same checks, even in a dry run -----------------------------------
    Case("submit-eval-missing-checkpoint", "submit", ("--eval", "{ws}/run", "--checkpoint", "step_99", "--dry-run"), 2, "--checkpoint step_99: {ws}/run/checkpoints has no step_99 (has: step_2)", lambda ws: ws.run()),
    Case("submit-eval-unknown-suite", "submit", ("--eval", "{ws}/run", "--suite", "nosuch", "--dry-run"), 2, "--suite nosuch: unknown suite", lambda ws: ws.run()),
    Case("submit-eval-data-dir-missing", "submit", ("--eval", "{ws}/run", "--data-dir", "/missing", "--dry-run"), 2, "--data-dir /missing: no such folder", _gpu_run),
    Case("submit-eval-recipe-empty", "submit", ("--eval", "{ws}/run", "--dry-run"), 2, "run/recipe.yaml: empty", _run_with_recipe("")),
    # ---- submit: nodes the recipe does not use, values a script cannot hold ------------------
    Case("submit-nodes-beyond-gpu-recipe", "submit", ("--recipe", Q, "--nodes", "2", "--dry-run"), 2, "--nodes 2: the recipe trains on cluster.num_nodes=1 node(s); NeMo RL would leave 1 allocated node(s) idle. Fix: add the override cluster.num_nodes=2", subprocess=True),
    Case("submit-nodes-beyond-cpu-recipe", "submit", ("--recipe", T, "--nodes", "2", "--dry-run"), 0, "--nodes 2: the job starts a Ray cluster of 2 nodes", changes=True, stdout="#SBATCH --nodes=2"),
    Case("submit-env-newline-override", "submit", ("--recipe", T, "slurm.env.FOO=a\nb", "--dry-run"), 2, "slurm.env.FOO: value holds a line break, which YAML folds into a space ('a b')"),
    Case("submit-env-newline-in-recipe", "submit", ("--recipe", "{ws}/r.yaml", "--dry-run"), 2, "slurm.env.FOO: value 'a\\nb' contains the control character", lambda ws: ws.recipe('slurm:\n  env:\n    FOO: "a\\nb"\n')),
]
# fmt: on
