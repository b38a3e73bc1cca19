"""Catalogue cases of bounded work, safe writes and verified reads: numbers too long to print,
`defaults:` lists that multiply, waits that never end, Slurm commands that never answer, files
that are symbolic links, required keys deleted, sources that lie about their tensors.

Same `Case` format as `catalogue_cases` (`{ws}` is the case's scratch folder), run by
`test_catalogue_safety.py` with the harness of `test_catalogue.py`; `command` may also be `eval`.
A victim file (`thesis.tex`) lives in the scratch folder, so a write through a link into it
shows as a change of the folder. Slurm's client commands are stand-ins on PATH
(`catalogue_cli_cases._slurm_stand_in`).
"""

from __future__ import annotations

from catalogue_cases import BF16, Case, Workspace
from catalogue_cli_cases import STAND_IN_PATH, _slurm_stand_in

T = "tiny/grpo-tiny-qwen3-cpu-bf16"
Q = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
RUN = ("--recipe", T, "--run-dir", "{ws}/run")
EVAL = ("--run", "{ws}/run")
LONG = "7" * 5000  # past Python's 4,300-digit limit on converting integers to and from text
TIMEOUT = {**STAND_IN_PATH, "NEMO_FP8_RL_SLURM_TIMEOUT_S": "1"}


def _multiplying_defaults(ws: Workspace, files: int = 3, times: int = 40) -> None:
    """Files that each list the next one `times` times: times**files merges."""
    for i in range(files):
        ws.write(f"m{i}.yaml", "defaults:\n" + f"  - m{i + 1}.yaml\n" * times)
    ws.write(f"m{files}.yaml", f"defaults: {BF16}\n")


def _checkpoint_scores(*scores: float):
    """A run with one checkpoint per score, each recording it as its validation accuracy."""

    def setup(ws: Workspace) -> None:
        import json

        run = ws.run(steps=tuple(range(1, len(scores) + 1)))
        for step, value in enumerate(scores, start=1):
            info = run / f"checkpoints/step_{step}/info.json"
            data = json.loads(info.read_text())
            data["validation/accuracy"] = value
            info.write_text(json.dumps(data))
            _rehash(run / f"checkpoints/step_{step}")

    return setup


def _rehash(step_dir) -> None:
    """Rewrite a checkpoint's manifest for its files as they are now."""
    import json

    from nemo_fp8_rl.engines.local.checkpoint import MANIFEST_FILE, _digest

    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    manifest["files"] = {name: _digest(step_dir / name) for name in manifest["files"]}
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))


def _flipped_state(ws: Workspace) -> None:
    from catalogue_cases import _flip_bit

    _flip_bit(ws.run() / "checkpoints/step_2/state.pt")


def _victim(ws: Workspace) -> None:
    ws.write("thesis.tex", "\\chapter{Results}\n")


def _link(rel: str, target: str, victim: bool = True):
    """Setup: `rel` is a symbolic link to `target` (a user's file, when `victim`)."""

    def setup(ws: Workspace) -> None:
        import os

        if victim:
            _victim(ws)
        path = ws.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)

    return setup


def _compare_with_link(ws: Workspace) -> None:
    from catalogue_cases import _compare_runs

    _compare_runs(ws)
    _link("rep/report.md", "../thesis.tex")(ws)


def _fifo_recipe(ws: Workspace) -> None:
    import os

    os.mkfifo(ws.root / "r.yaml")


def _copied_with_link(ws: Workspace) -> None:
    _link("mine.yaml", "thesis.tex")(ws)


def _export_link(target: str):
    def setup(ws: Workspace) -> None:
        ws.hf("src")
        _link("out", target, victim=False)(ws)

    return setup


def _edit_tensors(edit):
    """Setup: the tiny checkpoint with its tensors changed by `edit(tensors)` (in place)."""

    def setup(ws: Workspace) -> None:
        from safetensors.torch import load_file, save_file

        src = ws.hf("src")
        tensors = load_file(src / "model.safetensors")
        edit(tensors)
        save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})

    return setup


def _stray_scale(tensors) -> None:
    import torch

    tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(
        1, 3, dtype=torch.bfloat16
    )


def _int8_norm(tensors) -> None:
    import torch

    tensors["model.norm.weight"] = torch.ones(128, dtype=torch.int8)


def _transposed(tensors) -> None:
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name].t().contiguous()


def _repeated_in_two_shards(ws: Workspace) -> None:
    """A second shard, without an index, holding one layer again with other values."""
    from safetensors.torch import load_file, save_file

    src = ws.hf("src")
    name = "model.layers.0.mlp.down_proj.weight"
    again = {name: load_file(src / "model.safetensors")[name] * 2}
    save_file(again, src / "model-extra.safetensors", metadata={"format": "pt"})


def _empty_index(ws: Workspace) -> None:
    ws.hf("src")
    ws.write("src/model.safetensors.index.json", '{"metadata": {}, "weight_map": {}}')


def _huge_step(ws: Workspace, step: str = "1e300") -> None:
    """Two runs to compare, the FP8 one with a metrics line at an absurd step."""
    from catalogue_cases import _compare_runs

    _compare_runs(ws)
    with (ws.root / "fp8/metrics.jsonl").open("a") as f:
        f.write(f'{{"step": {step}, "train/reward": 0.5}}\n')


# One case per line, so the table reads as a table.
# fmt: off
CASES: list[Case] = [
    # ---- numbers too long to print: one bound, every reader ----------------------------------
    Case("long-int-override", "recipes", ("show", T, f"grpo.seed={LONG}"), 2, "a whole number of 5,000 digits, more than the 40 this reads", subprocess=True),
    Case("long-int-in-recipe", "recipes", ("show", "{ws}/r.yaml"), 2, "a whole number of 5,000 digits, more than the 40 this reads (line 3", lambda ws: ws.recipe(f"grpo:\n  max_num_steps: {LONG}\n")),
    Case("long-hex-in-recipe", "recipes", ("show", "{ws}/r.yaml"), 2, "a whole number of 5,001 digits", lambda ws: ws.recipe(f"env:\n  x: 0x{'f' * 4999}\n")),
    Case("long-int-delete-value", "recipes", ("show", T, f"~env.math.num_workers={LONG}"), 2, "a whole number of 5,000 digits"),
    Case("long-int-train", "train", (*RUN, f"policy.train_global_batch_size={LONG}", "--dry-run"), 2, "a whole number of 5,000 digits"),
    Case("long-int-seeds", "train", ("--recipe", T, "--seeds", f"1-{LONG}", "--dry-run"), 2, "a whole number of 5,000 digits, more than the 40 this reads. Fix: give seeds below 2**32"),
    Case("long-int-submit-seeds", "submit", ("--recipe", T, "--seeds", LONG, "--dry-run"), 2, "a whole number of 5,000 digits"),
    Case("long-int-eval-checkpoint", "eval", (*EVAL, "--checkpoint", f"step_{LONG}"), 2, "expected last, best or step_N (N at most 40 digits)", lambda ws: ws.run()),
    Case("long-int-eval-num-problems", "eval", (*EVAL, "--num-problems", LONG), 2, "--num-problems: expected a whole number >= 1", lambda ws: ws.run()),
    # ---- work that multiplies ------------------------------------------------------------------
    Case("defaults-multiplying", "recipes", ("show", "{ws}/m0.yaml"), 2, "defaults resolve more than 256 parent files in all (from m0.yaml", _multiplying_defaults, subprocess=True),
    Case("eval-num-problems-beyond-suite", "eval", (*EVAL, "--num-problems", "1000000"), 2, "--num-problems 1000000: add2-heldout has ", lambda ws: ws.run()),
    # ---- waits that end ------------------------------------------------------------------------
    Case("cancel-wait-inf", "submit", ("cancel", "4242", "--wait", "inf"), 2, "--wait: expected a finite number of seconds > 0 and at most 86400 (a day), got 'inf'"),
    Case("cancel-wait-nan", "submit", ("cancel", "4242", "--wait", "nan"), 2, "got 'nan'"),
    Case("cancel-wait-negative", "submit", ("cancel", "4242", "--wait", "-5"), 2, "got '-5'"),
    Case("status-scontrol-hangs", "submit", ("status", "4242"), 1, "scontrol show job -o 4242: no answer in 1 s", _slurm_stand_in(scontrol="sleep 600"), env=TIMEOUT, subprocess=True),
    Case("cancel-scancel-hangs", "submit", ("cancel", "4242", "--wait", "5"), 1, "scancel 4242: no answer in 1 s", _slurm_stand_in(scancel="sleep 600"), env=TIMEOUT),
    Case("slurm-timeout-setting-bad", "submit", ("status", "4242"), 1, "NEMO_FP8_RL_SLURM_TIMEOUT_S='inf': not a finite number", _slurm_stand_in(scontrol="exit 0"), env={**STAND_IN_PATH, "NEMO_FP8_RL_SLURM_TIMEOUT_S": "inf"}),
    Case("sbatch-info-line-first", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 0, "", _slurm_stand_in(sbatch="echo 'INFO: job submitted to the default QOS'; echo '4242;cluster'"), env=STAND_IN_PATH, changes=True, stdout="4242"),
    # ---- eval reads what it scores ------------------------------------------------------------
    Case("eval-best-all-nan", "eval", (*EVAL, "--checkpoint", "best"), 2, "no checkpoint records validation/accuracy", _checkpoint_scores(float("nan"), float("nan"))),
    # ---- nothing written through a symbolic link ----------------------------------------------
    Case("lock-file-is-link", "train", RUN, 2, "run/.run.lock: is a symbolic link (to ../thesis.tex); nothing was written through it", _link("run/.run.lock", "../thesis.tex"), subprocess=True),
    Case("run-dir-link-loop", "train", RUN, 2, "run: is a symbolic link loop, so it names no run folder", _link("run", "run", victim=False)),
    Case("seeds-run-dir-link-loop", "train", ("--recipe", T, "--run-dir", "{ws}/group", "--seeds", "1-2", "--dry-run"), 2, "is a symbolic link loop", _link("group", "group", victim=False)),
    Case("compare-report-is-link", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 2, "--out {ws}/rep: holds symbolic links (report.md); nothing was written", _compare_with_link),
    Case("compare-out-link-loop", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 2, "rep: is a symbolic link loop, so it names no report folder", lambda ws: (__import__("catalogue_cases")._compare_runs(ws), _link("rep", "rep", victim=False)(ws))),
    Case("cp-over-link", "recipes", ("cp", T, "{ws}/mine.yaml", "--overwrite"), 2, "mine.yaml: is a symbolic link (to thesis.tex)", _copied_with_link),
    Case("submit-job-file-is-link", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 2, "grpo-tiny-qwen3-cpu-bf16.yaml: is a symbolic link (to ../../thesis.tex)", _link("run/slurm/grpo-tiny-qwen3-cpu-bf16.yaml", "../../thesis.tex"), env=STAND_IN_PATH),
    Case("export-target-link-loop", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "out: is a symbolic link (to out); nothing was written", _export_link("out")),
    Case("export-target-dangling-link", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "out: is a symbolic link (to nowhere); nothing was written. Fix: give the folder the export should be", _export_link("nowhere")),
    Case("fifo-recipe", "recipes", ("show", "{ws}/r.yaml"), 2, "r.yaml: <file>: is not a regular file", _fifo_recipe),
    # ---- every base key is required; + adds, ++ adds or sets -----------------------------------
    Case("delete-free-form-section", "recipes", ("show", T, "~env"), 2, "override: env: missing (every key of the base config is required). Fix: drop ~env"),
    Case("delete-free-form-env-vars", "train", ("--recipe", Q, "--dry-run", "~policy.megatron_cfg.env_vars"), 2, "override: policy.megatron_cfg.env_vars: missing"),
    Case("delete-env-data-names", "recipes", ("show", Q, "~env.math"), 2, "data.default.env_name: names env.math, which the recipe does not have (env sections: "),
    Case("model-name-mapping", "recipes", ("show", T, "policy.model_name={a: 1}"), 2, "policy.model_name: expected string or null, got mapping"),
    Case("model-name-list-in-file", "recipes", ("show", "{ws}/r.yaml"), 2, "policy.model_name: expected string or null, got list", lambda ws: ws.recipe("policy:\n  model_name: [a, b]\n")),
    Case("wandb-entity-cpu", "recipes", ("show", T, "logger.wandb.entity=my-team"), 0, "", changes=True, stdout="entity: my-team"),
    Case("wandb-entity-gpu", "submit", ("--recipe", Q, "logger.wandb.entity=my-team", "--dry-run"), 0, "", changes=True, stdout="#SBATCH"),
    Case("wandb-entity-mapping", "recipes", ("show", T, "logger.wandb.entity={a: 1}"), 2, "logger.wandb.entity: expected str, got mapping"),
    Case("plus-on-a-set-key", "recipes", ("show", T, "+grpo.seed=5"), 2, "+grpo.seed=5: + adds a key, but grpo.seed is already set. Fix: write grpo.seed=<value> (or ++grpo.seed=<value>"),
    Case("plus-plus-on-a-set-key", "recipes", ("show", T, "++grpo.seed=5"), 0, "", changes=True, stdout="seed: 5"),
    Case("plus-new-free-form-key", "recipes", ("show", T, "+env.extra.workers=2"), 0, "", changes=True, stdout="extra:\n    workers: 2"),
    Case("plus-unknown-key", "recipes", ("show", T, "+grpo.max_num_step=3"), 2, "grpo.max_num_step: unknown key (not in the base config or the project schema). Fix: did you mean grpo.max_num_steps?"),
    # ---- --seeds refuses what plain train refuses, before any child starts ---------------------
    Case("seeds-run-dir-root", "train", ("--recipe", T, "--run-dir", "/", "--seeds", "1-2"), 2, "/: is the root or home folder, which a run must not write into"),
    Case("seeds-run-dir-home", "train", ("--recipe", T, "--run-dir", "{ws}/home", "--seeds", "1-2"), 2, "is the root or home folder", lambda ws: ws.write("home/.bashrc", "x\n"), env={"HOME": "{ws}/home"}),
    Case("seeds-plus-seed", "train", ("--recipe", T, "--seeds", "1-2", "--dry-run", "+grpo.seed=5"), 2, "--seeds: sets grpo.seed for each run, but the overrides also set it (+grpo.seed=5)"),
    Case("seeds-plus-plus-seed", "train", ("--recipe", T, "--seeds", "1-2", "--dry-run", "++grpo.seed=5"), 2, "the overrides also set it (++grpo.seed=5)"),
    Case("seeds-preflight", "train", ("--recipe", T, "--seeds", "1-2", "--preflight"), 3, "error: --preflight: NeMo RL is not usable here"),
    # ---- refit export reads what it converts ---------------------------------------------------
    Case("export-stray-scale-inv", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "model.safetensors: holds model.layers.0.mlp.down_proj.weight_scale_inv, a quantization scale: the checkpoint is already quantized", _edit_tensors(_stray_scale)),
    Case("export-int8-tensor", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "model.norm.weight is I8, not a BF16, FP16 or FP32 weight", _edit_tensors(_int8_norm), subprocess=True),
    Case("export-transposed-weight", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "hidden_size is 128 but model.layers.1.mlp.down_proj.weight has 384 rows (transposed?)", _edit_tensors(_transposed)),
    Case("export-tensor-in-two-shards", "refit", ("export", "{ws}/src", "{ws}/out"), 1, "holds model.layers.0.mlp.down_proj.weight, which model-extra.safetensors holds too", _repeated_in_two_shards),
    Case("export-empty-index", "refit", ("export", "{ws}/src", "{ws}/out"), 1, "model.safetensors.index.json: weight_map is empty", _empty_index),
    Case("export-negative-first-bf16", "refit", ("export", "{ws}/src", "{ws}/out", "--first-bf16", "-1"), 2, "num_first_layers_in_bf16: -1 is not a number of layers", lambda ws: ws.hf("src")),
    Case("export-negative-last-bf16", "refit", ("export", "{ws}/src", "{ws}/out", "--last-bf16", "-2"), 2, "num_last_layers_in_bf16: -2 is not a number of layers", lambda ws: ws.hf("src")),
    Case("export-empty-ignore-keyword", "refit", ("export", "{ws}/src", "{ws}/out", "--ignore", ""), 2, "holds an empty or non-text keyword, which every layer name contains", lambda ws: ws.hf("src")),
    # ---- logging endpoints probed before Ray starts ---------------------------------------------
    Case("mlflow-uri-dead", "train", (*RUN, "logger.mlflow_enabled=true", "logger.mlflow.tracking_uri=http://127.0.0.1:1"), 1, "MLflow (logger.mlflow.tracking_uri=http://127.0.0.1:1): nothing answers at 127.0.0.1:1", subprocess=True),
    Case("mlflow-env-uri-dead", "train", (*RUN, "logger.mlflow_enabled=true", "logger.mlflow.tracking_uri=null"), 1, "MLflow (MLFLOW_TRACKING_URI=http://127.0.0.1:1): nothing answers at 127.0.0.1:1", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}),
    Case("wandb-online-host-dead", "train", (*RUN, "logger.wandb_enabled=true"), 1, "W&B (http://127.0.0.1:1): nothing answers at 127.0.0.1:1", env={"WANDB_MODE": "online", "WANDB_BASE_URL": "http://127.0.0.1:1"}),
    # ---- what was wrongly refused, or silently dropped ------------------------------------------
    Case("cp-quoted-defaults-key", "recipes", ("cp", "{ws}/q.yaml", "{ws}/mine.yaml"), 0, "", lambda ws: ws.write("q.yaml", f'"defaults": {T}\ngrpo:\n  max_num_steps: 7\n'), changes=True, stdout="wrote {ws}/mine.yaml"),
    Case("cp-path-with-space-quoted", "recipes", ("cp", T, "{ws}/my runs/mine.yaml"), 0, "", lambda ws: (ws.root / "my runs").mkdir(), changes=True, stdout="nemo_fp8_rl.train --recipe '{ws}/my runs/mine.yaml'"),
    Case("mounts-empty-source", "submit", ("--recipe", T, "--container", "img", "--mounts", ":/data", "--dry-run"), 2, "--mounts: ':/data' is not a mount of the form SRC[:DST[:FLAGS]]"),
    Case("mounts-without-container", "submit", ("--recipe", T, "--mounts", "/lustre:/data", "--dry-run"), 2, "mounts are set but no container"),
    Case("compare-step-1e300", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "has no integer 'step' in [0, 2**53], skipped", _huge_step, changes=True),
    Case("compare-step-5000-digits", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/rep", "--no-plots"), 0, "too long to read", lambda ws: _huge_step(ws, LONG), changes=True),
    Case("study-garbled-record", "study", ("--analyse-only", "--out", "{ws}/study"), 2, "study/study.json: not a study record (JSONDecodeError", lambda ws: ws.write("study/study.json", "{garbled")),
    Case("study-record-not-object", "study", ("--analyse-only", "--out", "{ws}/study"), 2, "not a study record (a JSON object whose seeds are a list of whole numbers)", lambda ws: ws.write("study/study.json", '{"seeds": "1-3"}')),
    Case("eval-corrupted-state", "eval", EVAL, 1, "state.pt: fails its SHA-256 checksum (corrupted)", _flipped_state),
]
# fmt: on
