"""Catalogue cases of what must never be lost or run: output paths set by hand, `recipes import`
writing over links and sources, completion expanding file names, one bad seed switching a
verdict's metric, inputs that multiply, internal errors on odd inputs, `${oc.env:...}` read as
OmegaConf reads it, and rules an engine enforces checked before anything is queued.

Same `Case` format as `catalogue_cases` (`{ws}` is the case's scratch folder, which holds a
victim file `thesis.tex` where a case needs one), run by `test_catalogue_outputs.py` with the
harness of `test_catalogue_safety.py`. Besides the commands, `command` may be:

- `complete`: the bash completion script of `nemo_fp8_rl completion bash`, sourced in a real
  bash started in the scratch folder, called with `argv` as the words on the command line (the
  last one being completed); it prints what bash offers, one a line;
- `import-model`: `recipes import SRC OUT` (argv), then `OUT` loaded as a recipe; it prints
  `model_name=<repr>` of the loaded recipe's `policy.model_name`;
- `env`: `nemo_fp8_rl.env` (run only as the console script: `SUBPROCESS_ONLY`).
"""

from __future__ import annotations

import json
import os

from catalogue_cases import BF16, Case, Workspace
from catalogue_cli_cases import STAND_IN_PATH, _slurm_stand_in
from catalogue_safety_cases import _link, _multiplying_defaults, _victim

T = "tiny/grpo-tiny-qwen3-cpu-bf16"
Q = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
A = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-2n8g-async-1off-fp8"
CPU_ASYNC = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-async-1off-fp8"
CKPT = "checkpointing.checkpoint_dir"
SUBMITTED = _slurm_stand_in(sbatch="echo '4242;cluster'")
WIDE = {"COLUMNS": "1000"}  # the terminal report on one line per sentence (no wrapping)
SUBPROCESS_ONLY = {"env-torch-raises-runtime-error"}


def _mine(ws: Workspace) -> None:
    """A folder of the user's: `mine/thesis.tex`, no step_* folder in it."""
    ws.write("mine/thesis.tex", "\\chapter{Results}\n")


def _submit_with_mine(ws: Workspace) -> None:
    _mine(ws)
    SUBMITTED(ws)


def _nemo_checkpoint(rel: str, run_name: str):
    """Setup: `rel/step_5`, a NeMo RL checkpoint whose saved config names `run_name`."""

    def setup(ws: Workspace) -> None:
        ws.write(f"{rel}/step_5/config.yaml", f"logger:\n  wandb:\n    name: {run_name}\n")
        ws.write(f"{rel}/step_5/training_info.json", '{"step": 5}\n')

    return setup


def _other_run(ws: Workspace) -> None:
    """A finished run of another recipe in `{ws}/other` (recipe.yaml names it)."""
    ws.run("other")


def _planted_link_in_run(ws: Workspace) -> None:
    """An earlier run of T whose `logs` was replaced by a link to the user's folder."""
    import shutil

    run = ws.run()
    _mine(ws)
    shutil.rmtree(run / "logs", ignore_errors=True)
    os.symlink("../mine", run / "logs")


# ---- recipes import ---------------------------------------------------------------------------


def _nemo(ws: Workspace, **kw) -> None:
    """A NeMo RL-shaped config pair: `{ws}/grpo_base.yaml` and `{ws}/recipes/grpo-child.yaml`."""
    from test_nemo_import_cli import _nemo_shaped

    _nemo_shaped(ws.root, **kw)


def _nemo_child(body: str, rel: str = "n.yaml"):
    """Setup: the NeMo RL pair, and `rel` over its base with `body`."""

    def setup(ws: Workspace) -> None:
        _nemo(ws)
        ws.write(rel, f"defaults: grpo_base.yaml\n{body}")

    return setup


def _import_over_link(target: str):
    def setup(ws: Workspace) -> None:
        _nemo(ws)
        _link("mine.yaml", target)(ws)

    return setup


def _import_failing_over_recipe(ws: Workspace) -> None:
    """A config whose import fails validation, and the recipe `--overwrite` was to replace."""
    _nemo_child("grpo:\n  max_num_step: 5\n", "bad.yaml")(ws)
    ws.write("mine.yaml", f"defaults: {BF16}\n# my edits\n")


def _failing_config_here(ws: Workspace) -> None:
    """A config that fails validation, imported in its own folder with the default name."""
    _nemo_child("grpo:\n  max_num_step: 5\n", "bad.yaml")(ws)


def _multiplying_nemo(ws: Workspace) -> None:
    """Three files listing the next 40 times, over a NeMo RL config: 64,000 merges."""
    _nemo(ws)
    _multiplying_defaults(ws)
    ws.write("m3.yaml", "defaults: grpo_base.yaml\n")


def _env_config(value: str):
    return _nemo_child(f"policy:\n  model_name: '{value}'\n", "e.yaml")


# ---- completion -------------------------------------------------------------------------------


def _evil_recipe(ws: Workspace) -> None:
    """A recipe pack whose file name holds a command substitution."""
    home = ws.project_copy()
    (home / "recipes" / "evil").mkdir()
    (home / "recipes" / "evil" / "$(touch pwned).yaml").write_text(f"defaults: {BF16}\n")


# ---- compare over seeds -----------------------------------------------------------------------


def _seed_metrics(ws: Workspace, rel: str, recipe: str, seed: int, acc: float) -> None:
    """`rel`: a run of `recipe` (seed `seed`): reward 0.5 every step, `acc` at steps 10, 20."""
    config = {
        "grpo": {"max_num_steps": 20, "seed": seed},
        "logger": {"wandb": {"name": recipe}},
        "policy": {"generation": {"vllm_cfg": {"precision": "fp8" if "fp8" in recipe else "bf16"}}},
    }
    ws.write(f"{rel}/recipe.yaml", json.dumps(config))
    lines = []
    for step in range(1, 21):
        record = {"step": step, "train/reward": 0.5, "train/entropy": 0.8}
        if step % 10 == 0:
            record["validation/accuracy"] = acc
        lines.append(json.dumps(record))
    ws.write(f"{rel}/metrics.jsonl", "\n".join(lines) + "\n")


def _seeds_with_bad_accuracy(bad: float):
    """BF16 seeds 1-3 at 0.6, FP8 seeds 1-3 at 0.3 (30 points lower), the same reward; BF16
    seed 2 logged `bad` (inf or NaN) as its validation accuracy."""

    def setup(ws: Workspace) -> None:
        for seed in (1, 2, 3):
            _seed_metrics(ws, f"bf16/seed-{seed}", "bf16", seed, bad if seed == 2 else 0.6)
            _seed_metrics(ws, f"fp8/seed-{seed}", "fp8", seed, 0.3)

    return setup


def _two_runs_bad_accuracy(ws: Workspace) -> None:
    _seed_metrics(ws, "bf16", "bf16", 1, 0.6)
    _seed_metrics(ws, "fp8", "fp8", 1, float("inf"))


# ---- bounded reads ----------------------------------------------------------------------------


def _aliased_long_strings(ws: Workspace) -> None:
    """A 50 KB string aliased 400 times: 20 MB of text once expanded, from a 52 KB file."""
    body = "env:\n  big: &s " + "x" * 50_000 + "\n  copies: [" + ", ".join(["*s"] * 400) + "]\n"
    ws.recipe(body)


BOMB = "\n".join(
    ["bomb:", "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [
        f"  {chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]"
        for i in range(1, 9)
    ]
)


def _saved_recipe_bomb(ws: Workspace) -> None:
    """A run of T (same recipe name, steps logged) whose saved recipe.yaml ends in a bomb."""
    run = ws.run()
    with (run / "recipe.yaml").open("a") as f:
        f.write(BOMB + "\n")


def _compared_run_bomb(ws: Workspace) -> None:
    from catalogue_cases import _compare_runs

    _compare_runs(ws)
    with (ws.root / "fp8" / "recipe.yaml").open("a") as f:
        f.write(BOMB + "\n")


def _fake_torch(ws: Workspace) -> None:
    ws.write("fake/torch/__init__.py", "raise RuntimeError('CUDA driver 999 is broken')\n")


# One case per line, so the table reads as a table.
# fmt: off
CASES: list[Case] = [
    # ---- 1. hand-set output paths: the run-directory checks, at load, in dry runs, in submit ---
    Case("submit-overwrite-hand-set-user-folder", "submit", ("--recipe", Q, "--run-dir", "{ws}/run", "--overwrite", f"{CKPT}={{ws}}/mine"), 2, "mine: holds files NeMo RL does not write there (thesis.tex)", _submit_with_mine, env=STAND_IN_PATH),
    Case("submit-dry-run-log-dir-root", "submit", ("--recipe", Q, "--dry-run", "logger.log_dir=/"), 2, "logger.log_dir: /: is the root or home folder, which a run must not write into"),
    Case("show-checkpoint-dir-home", "recipes", ("show", Q, f"{CKPT}={{ws}}/home"), 2, "is the root or home folder", lambda ws: ws.write("home/.bashrc", "x\n"), env={"HOME": "{ws}/home"}),
    Case("validate-checkpoint-dir-a-file", "recipes", ("validate", "{ws}/r.yaml"), 2, "thesis.tex: is a file, not a folder", lambda ws: (_victim(ws), ws.recipe(f"checkpointing:\n  checkpoint_dir: {ws.root}/thesis.tex\n"))),
    Case("dry-run-checkpoint-dir-link", "train", ("--recipe", Q, "--dry-run", f"{CKPT}={{ws}}/link"), 2, "link: is a symbolic link (to mine), which a run does not write through", lambda ws: (_mine(ws), _link("link", "mine", victim=False)(ws))),
    Case("submit-checkpoint-dir-in-other-run", "submit", ("--recipe", Q, "--dry-run", f"{CKPT}={{ws}}/other/ckpt"), 2, "is inside the run directory {ws}/other of 'grpo-tiny-qwen3-cpu-bf16': another run's outputs", _other_run),
    Case("submit-checkpoint-dir-other-runs-checkpoints", "submit", ("--recipe", Q, "--dry-run", f"{CKPT}={{ws}}/ck"), 2, "holds checkpoints of another run ('someone-else', step_5)", _nemo_checkpoint("ck", "someone-else")),
    Case("submit-hand-set-checkpoints-without-resume", "submit", ("--recipe", Q, "--dry-run", f"{CKPT}={{ws}}/ck"), 2, "ck: already holds checkpoints (step_5). Fix: pass --resume", _nemo_checkpoint("ck", "grpo-qwen3-8b-base-1n8g-fp8")),
    Case("submit-hand-set-checkpoints-overwrite", "submit", ("--recipe", Q, "--dry-run", "--overwrite", f"{CKPT}={{ws}}/ck"), 2, "--overwrite removes only what the run created under its run directory, never a folder set by hand", _nemo_checkpoint("ck", "grpo-qwen3-8b-base-1n8g-fp8")),
    Case("submit-hand-set-checkpoints-resume", "submit", ("--recipe", Q, "--dry-run", "--resume", f"{CKPT}={{ws}}/ck"), 0, "", _nemo_checkpoint("ck", "grpo-qwen3-8b-base-1n8g-fp8"), stdout="#SBATCH"),
    Case("submit-log-dir-of-nemo-rl-experiments", "submit", ("--recipe", Q, "--dry-run", "logger.log_dir={ws}/logs"), 0, "", lambda ws: ws.write("logs/exp_001/events", "x"), stdout="#SBATCH"),
    Case("dry-run-cpu-recipe-hand-set-path", "train", ("--recipe", T, "--dry-run", f"{CKPT}={{ws}}/ck"), 2, "checkpointing.checkpoint_dir: the embedded engine writes logs and checkpoints under the run dir"),
    Case("submit-cpu-recipe-hand-set-path", "submit", ("--recipe", T, "--dry-run", f"{CKPT}={{ws}}/ck"), 2, "the embedded engine writes logs and checkpoints under the run dir"),
    Case("submit-seeds-hand-set-path", "submit", ("--recipe", Q, "--seeds", "1-2", "--dry-run", f"{CKPT}={{ws}}/ck"), 2, "a job array trains every seed with the same recipe file"),
    Case("overwrite-run-output-is-a-link", "train", ("--recipe", T, "--run-dir", "{ws}/run", "--overwrite"), 2, "run/logs: is a symbolic link, so it is not removed; nothing was removed", _planted_link_in_run),
    # ---- 2. recipes import writes through safe_files -------------------------------------------
    Case("import-over-link", "recipes", ("import", "{ws}/recipes/grpo-child.yaml", "{ws}/mine.yaml", "--overwrite"), 2, "mine.yaml: is a symbolic link (to thesis.tex); nothing was written through it", _import_over_link("thesis.tex")),
    Case("import-over-dangling-link", "recipes", ("import", "{ws}/recipes/grpo-child.yaml", "{ws}/mine.yaml"), 2, "mine.yaml: is a symbolic link (to elsewhere/new.yaml)", _import_over_link("elsewhere/new.yaml")),
    Case("import-failing-keeps-the-recipe-it-replaces", "recipes", ("import", "{ws}/bad.yaml", "{ws}/mine.yaml", "--overwrite"), 2, "grpo.max_num_step: unknown key", _import_failing_over_recipe),
    Case("import-default-name-is-the-source", "recipes", ("import", "{ws}/grpo_base.yaml", "--overwrite"), 2, "grpo_base.yaml: is the NeMo RL config being imported; nothing was written", _nemo),
    Case("import-failing-default-name-is-the-source", "recipes", ("import", "{ws}/bad.yaml", "--overwrite"), 2, "bad.yaml: is the NeMo RL config being imported", _failing_config_here),
    Case("import-over-its-parent", "recipes", ("import", "{ws}/recipes/grpo-child.yaml", "{ws}/grpo_base.yaml", "--overwrite"), 2, "is the NeMo RL config a parent of the one imported", _nemo),
    # ---- 3. completion never expands a recipe name -------------------------------------------
    Case("complete-recipe-named-command-substitution", "complete", ("nemo_fp8_rl.train", "--recipe", "evil/"), 0, "", _evil_recipe, env={"NEMO_FP8_RL_HOME": "{ws}/project"}, stdout="evil/$(touch pwned)"),
    # ---- 4. one bad seed never switches the verdict's metric ------------------------------------
    Case("compare-seed-accuracy-inf", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "30.0 points lower than BF16", _seeds_with_bad_accuracy(float("inf")), changes=True, env=WIDE, stdout="validation/accuracy is inf at step 10, inf at step 20"),
    Case("compare-seed-accuracy-nan", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "30.0 points lower than BF16", _seeds_with_bad_accuracy(float("nan")), changes=True, env=WIDE, stdout="left out: a NaN or infinite accuracy"),
    Case("compare-two-runs-accuracy-inf", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "accuracy not comparable (fp8: validation/accuracy NaN or infinite", _two_runs_bad_accuracy, changes=True, env=WIDE),
    # ---- 5. inputs that multiply: bounded ------------------------------------------------------
    Case("import-multiplying-defaults", "recipes", ("import", "{ws}/m0.yaml", "{ws}/out.yaml"), 2, "defaults resolve more than 256 parent files in all (from m0.yaml", _multiplying_nemo),
    Case("show-aliased-long-strings", "recipes", ("show", "{ws}/r.yaml"), 2, "aliases expand to more than 16,777,216 characters of text", _aliased_long_strings, subprocess=True),
    Case("dry-run-aliased-long-strings", "train", ("--recipe", "{ws}/r.yaml", "--dry-run"), 2, "aliases expand to more than 16,777,216 characters of text", _aliased_long_strings),
    Case("saved-recipe-alias-bomb", "train", ("--recipe", T, "--run-dir", "{ws}/run"), 2, "run/recipe.yaml: cannot read the saved recipe (aliases expand to more than 2,000,000 values", _saved_recipe_bomb),
    Case("compare-run-recipe-alias-bomb", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "fp8/recipe.yaml: not a readable recipe, ignored (aliases expand to more than 2,000,000 values", _compared_run_bomb, changes=True, env=WIDE),
    # ---- 6. internal errors on odd inputs: located errors -----------------------------------------
    Case("mlflow-uri-malformed-in-recipe", "recipes", ("show", T, "logger.mlflow_enabled=true", "logger.mlflow.tracking_uri=htp:/x"), 2, "logger.mlflow.tracking_uri: 'htp:/x': MLflow has no tracking store for the scheme 'htp'"),
    Case("mlflow-env-uri-no-host", "train", ("--recipe", T, "--run-dir", "{ws}/run", "logger.mlflow_enabled=true", "logger.mlflow.tracking_uri=null"), 1, "MLflow (MLFLOW_TRACKING_URI=http://): 'http://' names no host", env={"MLFLOW_TRACKING_URI": "http://"}),
    Case("mlflow-env-file-store-is-a-file", "train", ("--recipe", T, "--run-dir", "{ws}/run", "logger.mlflow_enabled=true"), 1, "thesis.tex is a file, not the store's folder", _victim, env={"MLFLOW_TRACKING_URI": "file://{ws}/thesis.tex"}),
    Case("import-section-null", "recipes", ("import", "{ws}/n.yaml", "{ws}/out.yaml"), 2, "n.yaml: grpo: expected a section (key: value lines under it), got null", _nemo_child("grpo: null\n")),
    Case("import-section-list", "recipes", ("import", "{ws}/n.yaml", "{ws}/out.yaml"), 2, "n.yaml: policy: expected a section (key: value lines under it), got a list ([1, 2])", _nemo_child("policy: [1, 2]\n")),
    Case("dry-run-nemo-config-section-null", "train", ("--recipe", "{ws}/n.yaml", "--dry-run"), 2, "grpo: expected a section", _nemo_child("grpo: null\n"), subprocess=True),
    Case("dry-run-nemo-config-subsection-list", "train", ("--recipe", "{ws}/n.yaml", "--dry-run"), 2, "policy.generation: expected a section", _nemo_child("policy:\n  generation: [vllm]\n")),
    Case("env-torch-raises-runtime-error", "env", (), 0, "", _fake_torch, env={"PYTHONPATH": "{ws}/fake"}, stdout="GPUs: unknown (torch does not import: RuntimeError: CUDA driver 999 is broken)", subprocess=True),
    # ---- 7. ${oc.env:...} as OmegaConf reads it --------------------------------------------------
    Case("oc-env-default-env-a-set", "import-model", ("{ws}/e.yaml", "{ws}/out.yaml"), 0, "", _env_config("${oc.env:A,${oc.env:B}}"), env={"A": "/data/a", "B": "/data/b"}, changes=True, stdout="model_name='/data/a'\n"),
    Case("oc-env-default-env-only-b", "import-model", ("{ws}/e.yaml", "{ws}/out.yaml"), 0, "", _env_config("${oc.env:A,${oc.env:B}}"), env={"B": "/data/b"}, changes=True, stdout="model_name='/data/b'\n"),
    Case("oc-env-value-holds-interpolation", "import-model", ("{ws}/e.yaml", "{ws}/out.yaml"), 0, "", _env_config("${oc.env:A}"), env={"A": "${grpo.seed}"}, changes=True, stdout="model_name='${grpo.seed}'\n"),
    Case("oc-env-default-is-eager", "import-model", ("{ws}/e.yaml", "{ws}/out.yaml"), 2, "policy.model_name: needs the environment variable B", _env_config("${oc.env:A,${oc.env:B}}"), env={"A": "/data/a"}),
    # ---- 8. what the engine refuses, refused at load, in submit and in dry runs ------------------
    Case("show-async-dynamic-sampling", "recipes", ("show", A, "grpo.use_dynamic_sampling=true"), 2, "grpo.use_dynamic_sampling: True is refused with grpo.async_grpo.enabled by NeMo RL's examples/run_grpo.py"),
    Case("submit-async-colocated", "submit", ("--recipe", A, "--dry-run", "policy.generation.colocated.enabled=true"), 2, "policy.generation.colocated.enabled: True is refused with grpo.async_grpo.enabled"),
    Case("dry-run-async-cpu-recipe", "train", ("--recipe", CPU_ASYNC, "--dry-run"), 2, "grpo.async_grpo.enabled: the embedded engine runs synchronous GRPO"),
    Case("submit-async-cpu-recipe", "submit", ("--recipe", CPU_ASYNC, "--dry-run"), 2, "the embedded engine runs synchronous GRPO"),
    Case("show-gpu-data-plane", "recipes", ("show", Q, "data_plane.enabled=true"), 2, "data_plane.enabled: the NeMo RL engine runs the legacy data path"),
    Case("validate-gpu-refit-bridge-project", "recipes", ("show", Q, "refit.bridge=project"), 2, "refit.bridge: project is not available on the NeMo RL engine yet"),
]
# fmt: on
