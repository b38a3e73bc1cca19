"""Catalogue of the commands' own words: every failure one located line with a fix, the exit
codes of the README, recipes copied and edited the torchtune way.

Same `Case` as `catalogue_cases.py` (`{ws}` is the case's scratch folder). Where a case needs
Slurm, `_slurm_stand_in` puts stand-ins for Slurm's client commands on PATH: shell scripts that
answer as a cluster would (a refused submission, a job Slurm has no record of). They stand in
for a Slurm cluster only; everything else is the real command.
"""

from __future__ import annotations

import os
import stat

from catalogue_cases import BF16, Case, Workspace

T = "tiny/grpo-tiny-qwen3-cpu-bf16"
F = "tiny/grpo-tiny-qwen3-cpu-fp8"
Q = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
STAND_IN_PATH = {"PATH": "{ws}/slurm-stand-in:" + os.environ.get("PATH", "/usr/bin:/bin")}

# Slurm's client commands as a cluster answers: sbatch refuses the partition; scontrol, squeue
# and sacct know no job (they print nothing, as Slurm does for a job it has forgotten).
SBATCH_REFUSES = "echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1"
KNOWS_NOTHING = "exit 0"


def _slurm_stand_in(**commands: str):
    def setup(ws: Workspace) -> None:
        for name, body in commands.items():
            path = ws.write(f"slurm-stand-in/{name}", f"#!/bin/sh\n{body}\n")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    return setup


def _recipe(body: str, rel: str = "r.yaml"):
    return lambda ws: ws.write(rel, body)


def _copied(ws: Workspace) -> None:
    """A recipe copied with `recipes cp` into the scratch folder (as a user would)."""
    from nemo_fp8_rl.config.recipe_copy import copy_recipe

    copy_recipe(F, ws.root / "mine.yaml")


TWO = "grpo.max_num_steps=2"


def _seed_runs(finished: tuple[int, ...] = (), part_way: tuple[int, ...] = ()):
    """`group/seed-<k>` runs of 2 steps: finished (checkpoint step_2) or stopped part-way
    (checkpoint step_1 only)."""

    def setup(ws: Workspace) -> None:
        for seeds, saved in ((finished, (2,)), (part_way, (1,))):
            for seed in seeds:
                ws.run(f"group/seed-{seed}", overrides=(f"grpo.seed={seed}", TWO), steps=saved)

    return setup


SHOW = ("show", "{ws}/r.yaml")
GROUP = ("--recipe", T, "--run-dir", "{ws}/group")

# fmt: off
CASES: list[Case] = [
    # ---- one voice: every failure is `error: <where>: <what>. Fix: <how>` on stderr ----------
    Case("engine-unavailable", "train", ("--recipe", Q, "--run-dir", "{ws}/run"), 3, "needs the NeMo RL engine, which is not usable here"),
    Case("engine-local-for-gpu-recipe", "train", ("--recipe", Q, "--engine", "local"), 3, "the local engine runs CPU recipes only"),
    Case("preflight-without-nemo-rl", "train", ("--recipe", Q, "--preflight"), 3, "error: --preflight: NeMo RL is not usable here", subprocess=True),
    Case("seeds-engine-unavailable", "train", ("--recipe", Q, "--seeds", "1-2", "--dry-run"), 3, "needs the NeMo RL engine"),
    Case("submit-sbatch-refuses", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 1, "invalid partition specified: nope. Fix:", _slurm_stand_in(sbatch=SBATCH_REFUSES), changes=True, env=STAND_IN_PATH, subprocess=True),
    Case("submit-status-unknown-job", "submit", ("status", "4242"), 1, "error: job 4242: Slurm has no record of it", _slurm_stand_in(scontrol=KNOWS_NOTHING, squeue=KNOWS_NOTHING, sacct=KNOWS_NOTHING), env=STAND_IN_PATH, subprocess=True),
    Case("submit-logs-unknown-job", "submit", ("logs", "4242"), 1, "error: job 4242: no log files found", _slurm_stand_in(scontrol=KNOWS_NOTHING), env=STAND_IN_PATH),
    Case("submit-without-slurm", "submit", ("status", "4242"), 1, "scontrol: not found", env={"PATH": "{ws}/empty"}),
    Case("submit-bad-job-id-voice", "submit", ("cancel", "12;rm"), 1, "job id '12;rm': not a Slurm job id"),
    Case("submit-eval-flag-without-eval", "submit", ("--recipe", T, "--checkpoint", "step_2", "--dry-run"), 2, "--checkpoint: goes with --eval RUN"),
    Case("eval-not-a-run", "eval", ("--run", "{ws}/nope"), 2, "is not a run directory"),
    Case("eval-unknown-flag", "eval", ("--run", "{ws}/nope", "--fast"), 2, "unrecognized arguments: --fast"),
    Case("compare-no-args", "compare", (), 2, "the following arguments are required"),
    Case("compare-json-recipes", "compare", (T, F, "--json"), 2, "--json goes with runs"),
    Case("refit-no-subcommand", "refit", (), 2, "the following arguments are required"),
    Case("recipes-unknown-subcommand", "recipes", ("lst",), 2, "invalid choice: 'lst'"),
    Case("validate-invalid", "recipes", ("validate", "{ws}/r.yaml"), 2, "error: recipes validate: 1 of 1 recipe(s) invalid", _recipe(f"defaults: {BF16}\ngrpo:\n  max_num_step: 3\n"), stdout="did you mean grpo.max_num_steps?"),
    # ---- unknown recipe names: the closest names, not all of them -----------------------------
    Case("recipe-typo-train", "train", ("--recipe", "tiny/grpo-tiny-qwen3-cpu-bf1", "--dry-run"), 2, "did you mean tiny/grpo-tiny-qwen3-cpu-bf16", subprocess=True),
    Case("recipe-typo-stem", "recipes", ("show", "grpo-qwen3-4b-1n8g-fp9"), 2, "did you mean qwen3-4b/grpo-qwen3-4b-1n8g-fp8"),
    Case("recipe-typo-submit", "submit", ("--recipe", "tiny/grpo-tiny-qwen3-cpu-fp8-uncalibrate", "--dry-run"), 2, "did you mean tiny/grpo-tiny-qwen3-cpu-fp8-uncalibrated"),
    Case("recipe-typo-compare", "compare", (T, "tiny/grpo-tiny-qwen3-cpu-fp9"), 2, "did you mean the recipe tiny/grpo-tiny-qwen3-cpu-fp8"),
    Case("recipe-nothing-close", "recipes", ("show", "zzzz"), 2, "nemo_fp8_rl.recipes list` shows every recipe"),
    Case("defaults-typo-short-name", "recipes", SHOW, 2, "did you mean tiny/grpo-tiny-qwen3-cpu-bf16", _recipe("defaults: tiny/grpo-tiny-qwen3-cpu-bf61\n")),
    # ---- YAML 1.1 booleans and numbers as keys ------------------------------------------------
    Case("yaml-key-yes-top", "recipes", SHOW, 2, "key yes is read as the boolean True, not as a name (line 2, column 1)", _recipe(f"defaults: {BF16}\nyes: 1\n"), subprocess=True),
    Case("yaml-key-on-nested", "recipes", SHOW, 2, "key on is read as the boolean True, not as a name (line 3, column 3)", _recipe(f"defaults: {BF16}\nenv:\n  on: 1\n")),
    Case("yaml-key-number", "train", ("--recipe", "{ws}/r.yaml", "--dry-run"), 2, "key 1 is read as the number 1, not as a name (line 3", _recipe(f"defaults: {BF16}\nenv:\n  1: x\n")),
    Case("yaml-key-null", "recipes", SHOW, 2, "key ~ is read as null", _recipe(f"defaults: {BF16}\nenv:\n  ~: x\n")),
    Case("yaml-key-in-override", "recipes", ("show", T, "env.x={yes: 1}"), 2, "is read as the boolean True"),
    # ---- recipes the torchtune way: short names in defaults, ~key, cp -------------------------
    Case("defaults-short-recipe-name", "recipes", SHOW, 0, "", _recipe(f"defaults: {T}\ngrpo:\n  max_num_steps: 7\n"), changes=True, stdout="max_num_steps: 7"),
    Case("defaults-short-config-names", "recipes", SHOW, 0, "", _recipe(f"defaults:\n  - {T}\n  - configs/precision/fp8-blockwise\n  - precision/fp8-kvcache\n  - configs/loss/calibrated-clipping.yaml\n"), changes=True, stdout="kv_cache_dtype: fp8"),
    Case("delete-key-free-form", "recipes", ("show", T, "~env.math.num_workers"), 0, "", changes=True, stdout="math_verify_impl: hf_math_verify"),
    Case("delete-key-with-value", "recipes", ("show", T, "~env.math.num_workers=8"), 0, "", changes=True, stdout="math_verify_impl"),
    Case("delete-key-wrong-value", "recipes", ("show", T, "~env.math.num_workers=9"), 2, "~env.math.num_workers=9: the value of env.math.num_workers is 8, not 9"),
    Case("delete-missing-key", "recipes", ("show", T, "~env.nope"), 2, "~env.nope: no key env.nope to delete"),
    Case("delete-required-key", "recipes", ("show", T, "~grpo.max_num_steps"), 2, "override: grpo.max_num_steps: missing (every key of the base config is required", subprocess=True),
    Case("delete-required-section", "train", ("--recipe", T, "--dry-run", "~checkpointing"), 2, "override: checkpointing: missing"),
    Case("delete-project-key", "recipes", ("show", T, "~slurm.setup_command"), 2, "override: slurm.setup_command: missing"),
    Case("delete-malformed", "recipes", ("show", T, "~"), 2, "malformed override"),
    Case("cp-writes-a-copy", "recipes", ("cp", T, "{ws}/mine.yaml"), 0, "", changes=True, stdout="wrote {ws}/mine.yaml"),
    Case("cp-into-folder", "recipes", ("cp", F, "{ws}"), 0, "", changes=True, stdout="wrote {ws}/grpo-tiny-qwen3-cpu-fp8.yaml"),
    Case("cp-refuses-existing", "recipes", ("cp", F, "{ws}/mine.yaml"), 2, "mine.yaml: already exists. Fix: give a new file name, or --overwrite", _copied),
    Case("cp-overwrite", "recipes", ("cp", T, "{ws}/mine.yaml", "--overwrite"), 0, "", _copied, changes=True),
    Case("cp-not-yaml", "recipes", ("cp", T, "{ws}/mine.txt"), 2, "mine.txt: not a .yaml file name"),
    Case("cp-no-folder", "recipes", ("cp", T, "{ws}/no/such/mine.yaml"), 2, "no/such: no such folder"),
    Case("cp-unknown-recipe", "recipes", ("cp", "tiny/grpo-tiny-qwen3-cpu-fp", "{ws}/mine.yaml"), 2, "did you mean tiny/grpo-tiny-qwen3-cpu-fp8"),
    Case("cp-copy-loads", "train", ("--recipe", "{ws}/mine.yaml", "--dry-run"), 0, "", _copied, changes=True, stdout="name: mine"),
    # ---- seeds: one syntax ----------------------------------------------------------------------
    Case("seeds-space-list", "train", ("--recipe", T, "--seeds", "1 2 3", "--dry-run"), 2, "is not a seed or a range. Fix: give seeds as a comma-separated list"),
    # ---- submit --seeds: planned per seed as train --seeds plans --------------------------------
    Case("submit-seeds-over-single-run", "submit", (*GROUP, "--seeds", "1-2", "--dry-run"), 2, "holds a single-seed run (recipe.yaml), and --seeds would put seed-<k>/ folders inside it", lambda ws: ws.run("group")),
    Case("submit-seeds-foreign-summary", "submit", (*GROUP, "--seeds", "1", "--dry-run"), 2, "seeds.json: not a seeds summary written by --seeds", lambda ws: ws.write("group/seeds.json", '{"runs": [1, 2]}')),
    Case("submit-seeds-finished-kept", "submit", (*GROUP, "--seeds", "1-2", "--dry-run", TWO), 0, "1 seed(s) of group in one Slurm job array; kept (finished before): 1; start: 2", _seed_runs(finished=(1,)), stdout='#SBATCH --array="2"'),
    Case("submit-seeds-all-kept", "submit", (*GROUP, "--seeds", "1-2", TWO), 0, "", _seed_runs(finished=(1, 2)), stdout="nothing to submit: every seed of group finished before"),
    Case("submit-seeds-resume-per-seed", "submit", (*GROUP, "--seeds", "1-2", "--resume", "--dry-run", TWO), 0, "start: 1; resume: 2", _seed_runs(part_way=(2,)), stdout="SEED_RESUME=2\n"),
]
# fmt: on
