"""The catalogue of bad inputs and faults: what a hostile user does, and what must happen.

Each `Case` names the command, its arguments (`{ws}` is the case's scratch folder, `{bf16}`,
`{fp8}`, `{qwen}` recipe files), an optional setup that builds files in the scratch folder, the
expected exit code, and a fragment the output must contain. Unless `changes` is set, the
scratch folder must be byte-for-byte unchanged afterwards (nothing lost, nothing half-written).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nemo_fp8_rl.config import load_recipe, project_root
from nemo_fp8_rl.engines.local import checkpoint as ckpt
from nemo_fp8_rl.runs import rundir

ROOT = project_root()
BF16 = ROOT / "recipes/tiny/grpo-tiny-qwen3-cpu-bf16.yaml"
FP8 = ROOT / "recipes/tiny/grpo-tiny-qwen3-cpu-fp8.yaml"
QWEN = ROOT / "recipes/qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8.yaml"


class Workspace:
    """A case's scratch folder, with builders for recipes, runs, checkpoints and HF models."""

    def __init__(self, root: Path, hf_source: Callable[[], Path]) -> None:
        self.root = root
        self._hf_source = hf_source

    def write(self, rel: str, data: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        return path

    def recipe(self, body: str, rel: str = "r.yaml", parent: Path = BF16) -> Path:
        """A recipe inheriting `parent`, plus `body`."""
        return self.write(rel, f"defaults: {parent}\n{body}")

    def run(
        self,
        rel: str = "run",
        recipe: Path = BF16,
        overrides: tuple[str, ...] = (),
        steps: tuple[int, ...] = (2,),
    ) -> Path:
        """A run dir as the embedded engine leaves it: recipe.yaml, metrics and checkpoints."""
        run_dir = self.root / rel
        r = load_recipe(recipe, list(overrides), run_dir=run_dir)
        rundir.prepare(run_dir, r.config, r.to_yaml(with_sources=True), resume=False)
        (run_dir / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "train/reward": 0.5}) + "\n" for s in range(1, 3))
        )
        for step in steps:
            state = {"trainer": {"w": torch.arange(64.0) * step}, "rng": torch.get_rng_state()}
            ckpt.save_checkpoint(run_dir / "checkpoints", step, state, {"recipe": r.name})
        return run_dir

    def hf(self, rel: str = "src") -> Path:
        """A copy of a tiny BF16 Hugging Face checkpoint (Qwen3, safetensors)."""
        dest = self.root / rel
        shutil.copytree(self._hf_source(), dest)
        return dest

    def export(self, rel: str = "out") -> Path:
        """A real earlier export of the tiny checkpoint into `rel`."""
        from nemo_fp8_rl.refit.export import convert_checkpoint

        src = self.hf("earlier-src")
        fp8 = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}
        convert_checkpoint(src, self.root / rel, fp8)
        shutil.rmtree(src)
        return self.root / rel

    def project_copy(self) -> Path:
        """recipes/ and configs/ copied, for cases that plant files under recipes/."""
        home = self.root / "project"
        for name in ("recipes", "configs"):
            shutil.copytree(ROOT / name, home / name)
        return home


Setup = Callable[[Workspace], object]


def write_tiny_hf(path: Path, hidden: int = 128, layers: int = 3, seed: int = 0) -> Path:
    """A tiny BF16 Qwen3 checkpoint in Hugging Face layout (config.json + model.safetensors),
    tensors named and shaped as transformers saves them; built without importing transformers."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    heads, kv, head_dim, inter, vocab = 4, 2, hidden // 4, 3 * hidden, 128
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": (kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": (head_dim,),
                p + "self_attn.k_norm.weight": (head_dim,),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
        )
    tensors = {
        n: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for n, s in shapes.items()
    }
    path.mkdir(parents=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text('{"do_sample": true}\n')
    return path


@dataclass(frozen=True)
class Case:
    """One bad input or fault and its expected outcome."""

    id: str
    command: str  # recipes | train | submit | compare | refit
    argv: tuple[str, ...]
    code: int
    fragment: str
    setup: Setup | None = None
    changes: bool = False  # the command may write (a success that is the right behaviour)
    env: dict[str, str] = field(default_factory=dict)
    stdout: str = ""  # a fragment stdout must also contain
    subprocess: bool = False  # also run as the real console script


def _flip_bit(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _bomb(ws: Workspace) -> None:
    lines = ["bomb:", "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"  {cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    ws.recipe("\n".join(lines) + "\n")


def _chain(ws: Workspace, depth: int = 600) -> None:
    ws.write(f"chain/c{depth}.yaml", f"defaults: {BF16}\n")
    for i in range(depth - 1, -1, -1):
        ws.write(f"chain/c{i}.yaml", f"defaults: c{i + 1}.yaml\n")


def _string_doubling(ws: Workspace) -> None:
    lines = ["env:", "  s0: abcdefgh"] + [
        f"  s{i}: ${{env.s{i - 1}}}${{env.s{i - 1}}}" for i in range(1, 40)
    ]
    ws.recipe("\n".join(lines) + "\n")


def _number_doubling(ws: Workspace) -> None:
    lines = ["env:", "  n0: 3"] + [
        f"  n{i}: ${{mul:${{env.n{i - 1}}},${{env.n{i - 1}}}}}" for i in range(1, 12)
    ]
    ws.recipe("\n".join(lines) + "\n")


def _binary_recipe(ws: Workspace) -> None:
    ws.write("bin.yaml", bytes(range(256)) * 8)


def _binary_under_recipes(ws: Workspace) -> None:
    home = ws.project_copy()
    (home / "recipes/tiny/broken.yaml").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))


def _other_recipe_checkpoint(ws: Workspace) -> None:
    ws.run("run")
    other = ws.run("other", recipe=FP8)
    shutil.rmtree(ws.root / "run/checkpoints")
    shutil.copytree(other / "checkpoints", ws.root / "run/checkpoints")
    shutil.rmtree(other)


def _hf_nan(ws: Workspace) -> None:
    from safetensors.torch import load_file, save_file

    ws.export("out")
    src = ws.hf("src")
    tensors = load_file(src / "model.safetensors")
    w = tensors["model.layers.0.mlp.down_proj.weight"].clone()
    w[0, 0] = float("nan")
    tensors["model.layers.0.mlp.down_proj.weight"] = w
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def _compare_runs(ws: Workspace) -> None:
    from test_compare import write_project_run

    write_project_run(ws.root / "bf16", 10, precision="bf16", acc_final=0.6, step_s=2.0)
    write_project_run(ws.root / "fp8", 10, precision="fp8", acc_final=0.6, step_s=1.5)


def _set(rel: str, data: str | bytes) -> Setup:
    return lambda ws: ws.write(rel, data)


def _recipe(body: str, parent: Path = BF16) -> Setup:
    return lambda ws: ws.recipe(body, parent=parent)


T = "tiny/grpo-tiny-qwen3-cpu-bf16"
Q = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"
SHOW = ("show", "{ws}/r.yaml")
RUN = ("--recipe", T, "--run-dir", "{ws}/run")
RESUME = (*RUN, "--resume")


def _show(override: str, recipe: str = T) -> tuple[str, ...]:
    return ("show", recipe, override)


# One case per line, so the table reads as a table.
# fmt: off
CASES: list[Case] = [
    # ---- recipes: files that are not recipes ------------------------------------------------
    Case("binary-recipe", "recipes", ("show", "{ws}/bin.yaml"), 2, "not a text file", _binary_recipe, subprocess=True),
    Case("binary-under-recipes-list", "recipes", ("list",), 1, "invalid recipe, left out of the list", _binary_under_recipes, env={"NEMO_FP8_RL_HOME": "{ws}/project"}, stdout="tiny/grpo-tiny-qwen3-cpu-fp8"),
    Case("binary-under-recipes-validate", "recipes", ("validate",), 2, "not a text file", _binary_under_recipes, env={"NEMO_FP8_RL_HOME": "{ws}/project"}, stdout=" valid, 1 invalid"),
    Case("nul-byte", "recipes", SHOW, 2, "not a text file (NUL byte", _set("r.yaml", f"defaults: {BF16}\ngrpo:\n  seed: 1\x00\n")),
    Case("latin1-bytes", "recipes", SHOW, 2, "not a text file", _set("r.yaml", f"defaults: {BF16}\n# caf\xe9\n".encode("latin-1"))),
    Case("huge-file", "recipes", SHOW, 2, "larger than the 16,777,216", _set("r.yaml", "#" * (16 * 2**20 + 1))),
    Case("folder-as-recipe", "recipes", ("show", "{ws}/dir.yaml"), 2, "is a folder", lambda ws: (ws.root / "dir.yaml").mkdir()),
    Case("missing-recipe", "recipes", ("show", "{ws}/nope.yaml"), 2, "no such recipe file or name"),
    Case("empty-file", "recipes", SHOW, 2, "policy.model_name: no model set", _set("r.yaml", "")),
    Case("top-level-list", "recipes", SHOW, 2, "top level is not a mapping", _set("r.yaml", "- a\n- b\n")),
    Case("yaml-syntax", "recipes", SHOW, 2, "invalid YAML", _recipe("grpo: [1, 2\n")),
    Case("tab-indent", "recipes", SHOW, 2, "invalid YAML", _recipe("grpo:\n\tseed: 1\n")),
    Case("unhashable-key", "recipes", SHOW, 2, "invalid YAML", _recipe("? [a, b]\n: 1\n")),
    # ---- recipes: YAML that PyYAML would accept silently or blow up on ----------------------
    Case("duplicate-key", "recipes", SHOW, 2, "duplicate key 'seed' (first set at line 3)", _recipe("grpo:\n  seed: 1\n  seed: 2\n")),
    Case("duplicate-section", "recipes", SHOW, 2, "duplicate key 'grpo'", _recipe("grpo:\n  seed: 1\nloss_fn:\n  ratio_clip_max: 0.3\ngrpo:\n  max_num_steps: 3\n")),
    Case("alias-bomb", "recipes", SHOW, 2, "aliases expand to more than 2,000,000 values", _bomb, subprocess=True),
    Case("recursive-alias", "recipes", SHOW, 2, "recursive alias", _recipe("env:\n  a: &a [*a]\n")),
    Case("deep-nesting", "recipes", SHOW, 2, "nested deeper than 64 levels", _recipe("env:\n  x: " + "[" * 100 + "]" * 100 + "\n")),
    Case("very-deep-nesting", "recipes", SHOW, 2, "nesting depth", _recipe("env:\n  x: " + "[" * 100000 + "]" * 100000 + "\n")),
    # ---- recipes: defaults chains -----------------------------------------------------------
    Case("defaults-int", "recipes", SHOW, 2, "defaults: expected a path or a list of paths, got 5", _set("r.yaml", "defaults: 5\n")),
    Case("defaults-list-of-int", "recipes", SHOW, 2, "expected a path or a list of paths, got [5]", _set("r.yaml", "defaults: [5]\n")),
    Case("defaults-mapping", "recipes", SHOW, 2, "expected a path or a list of paths", _set("r.yaml", "defaults: {a: b}\n")),
    Case("defaults-empty-string", "recipes", SHOW, 2, "expected a path or a list of paths", _set("r.yaml", "defaults: ['']\n")),
    Case("defaults-600-deep", "recipes", ("show", "{ws}/chain/c0.yaml"), 2, "defaults chain deeper than 32 files", _chain),
    Case("defaults-cycle", "recipes", ("show", "{ws}/a.yaml"), 2, "cycle in defaults chain", lambda ws: (ws.write("a.yaml", "defaults: b.yaml\n"), ws.write("b.yaml", "defaults: a.yaml\n"))),
    Case("defaults-missing-parent", "recipes", SHOW, 2, "parent 'nowhere.yaml' not found", _set("r.yaml", "defaults: nowhere.yaml\n")),
    Case("defaults-binary-parent", "recipes", SHOW, 2, "not a text file", lambda ws: (ws.write("p.yaml", b"\xff\xfe\x00"), ws.write("r.yaml", "defaults: p.yaml\n"))),
    # ---- recipes: interpolation -------------------------------------------------------------
    Case("div-by-zero", "recipes", SHOW, 2, "division by zero in ${div:1,0}", _recipe("env:\n  x: ${div:1,0}\n"), subprocess=True),
    Case("mul-string", "recipes", SHOW, 2, "mul takes numbers, got 'abcdefgh'", _recipe("env:\n  x: ${mul:abcdefgh,300000000}\n")),
    Case("mul-string-override", "recipes", _show("env.x=${mul:abcdefgh,300000000}"), 2, "mul takes numbers"),
    Case("string-doubling", "recipes", SHOW, 2, "grows past 65,536 characters", _string_doubling),
    Case("number-doubling", "recipes", SHOW, 2, "out of range", _number_doubling),
    Case("reference-cycle", "recipes", SHOW, 2, "reference cycle", _recipe("env:\n  a: ${env.b}\n  b: ${env.a}\n")),
    Case("unknown-resolver", "recipes", SHOW, 2, "unknown resolver 'oc.env'", _recipe("env:\n  a: ${oc.env:HOME}\n")),
    Case("missing-reference", "recipes", SHOW, 2, "no key grpo.nope", _recipe("env:\n  a: ${grpo.nope}\n")),
    Case("div-override", "recipes", _show("grpo.max_num_steps=${div:1,0}"), 2, "division by zero"),
    # ---- recipes: values --------------------------------------------------------------------
    Case("untyped-rule-input", "recipes", _show("grpo.num_prompts_per_step=abc"), 2, "grpo.num_prompts_per_step: expected integer, got string ('abc')", subprocess=True),
    Case("untyped-batch", "recipes", _show("policy.train_global_batch_size=[1]"), 2, "expected integer, got list"),
    Case("temperature-inf", "recipes", _show("policy.generation.temperature=.inf"), 2, "policy.generation.temperature: expected a finite number, got inf"),
    Case("temperature-nan", "recipes", _show("policy.generation.temperature=.nan"), 2, "expected a finite number, got nan"),
    Case("temperature-zero", "recipes", _show("policy.generation.temperature=0"), 2, "value 0 out of range. Fix: use a value > 0"),
    Case("lr-inf", "recipes", _show("policy.megatron_cfg.optimizer.lr=-.inf"), 2, "expected a finite number, got -inf"),
    Case("huge-float", "recipes", _show("grpo.max_num_steps=1e400"), 2, "expected integer, got number (inf)"),
    Case("top-k-negative", "recipes", _show("policy.generation.top_k=-7"), 2, "policy.generation.top_k: value -7 out of range. Fix: use a value -1 or null (no top-k filtering) or >= 1"),
    Case("top-k-zero", "recipes", _show("policy.generation.top_k=0"), 2, "top_k: value 0 out of range"),
    Case("top-k-string", "recipes", _show("policy.generation.top_k=abc"), 2, "expected integer or null, got string"),
    Case("top-k-minus-one", "recipes", _show("policy.generation.top_k=-1"), 0, "", changes=True, stdout="top_k: -1"),
    Case("top-p-above-one", "recipes", _show("policy.generation.top_p=1.5"), 2, "policy.generation.top_p: value 1.5 out of range"),
    Case("val-top-p-zero", "recipes", _show("policy.generation.val_top_p=0"), 2, "val_top_p: value 0 out of range"),
    Case("seed-beyond-64-bits", "recipes", _show("grpo.seed=36893488147419103232"), 2, "grpo.seed: value 36893488147419103232 out of range. Fix: use a value in [0, 2**32)"),
    Case("seed-negative", "recipes", _show("grpo.seed=-1"), 2, "grpo.seed: value -1 out of range"),
    Case("task-seed-huge", "recipes", _show("local.task.train_seed=99999999999999"), 2, "local.task.train_seed: Input should be less than 4294967296"),
    Case("calibration-inf", "recipes", _show("loss_fn.calibration.smoothing=.inf"), 2, "loss_fn.calibration.smoothing: Input should be a finite number"),
    Case("batch-zero", "recipes", _show("policy.train_global_batch_size=0"), 2, "value 0 out of range"),
    Case("ratio-clip-c-string", "recipes", _show("loss_fn.ratio_clip_c=big"), 2, "loss_fn.ratio_clip_c: expected number or null"),
    Case("tp-3-on-8-gpus", "recipes", _show("policy.megatron_cfg.tensor_model_parallel_size=3", Q), 2, "does not divide the cluster's 8 GPUs"),
    Case("vllm-tp-3-on-8-gpus", "recipes", _show("policy.generation.vllm_cfg.tensor_parallel_size=3", Q), 2, "vLLM model-parallel group of 3 GPUs"),
    Case("tp-cp-16-on-8-gpus", "recipes", _show("policy.megatron_cfg.context_parallel_size=16", Q), 2, "Megatron model-parallel group of 64 GPUs (tensor_model_parallel_size=4 x pipeline_model_parallel_size=1 x context_parallel_size=16)"),
    Case("hand-log-dir-embedded", "train", (*RUN, "logger.log_dir={ws}/logs"), 2, "logger.log_dir: the embedded engine writes logs and checkpoints under the run dir. Fix: remove it and use --run-dir DIR"),
    Case("hand-checkpoint-dir-seeds", "train", (*RUN, "--seeds", "1-2", "checkpointing.checkpoint_dir={ws}/ck"), 2, "checkpointing.checkpoint_dir: the embedded engine writes logs and checkpoints under the run dir"),
    Case("derived-run-name", "recipes", _show("logger.wandb.name=mine"), 2, "copy the recipe to a new file to rename the run"),
    Case("derived-in-file", "recipes", SHOW, 2, "Fix: remove it; the run name is the recipe file's name", _recipe("logger:\n  wandb:\n    name: mine\n")),
    Case("misspelt-key", "recipes", _show("grpo.max_num_step=3"), 2, "did you mean grpo.max_num_steps?"),
    Case("malformed-override", "recipes", _show("grpo.max_num_steps"), 2, "malformed override"),
    Case("env-int-accepted", "recipes", _show("slurm.env.OMP_NUM_THREADS=8"), 0, "", changes=True, stdout="OMP_NUM_THREADS: 8"),
    Case("env-bool-refused", "recipes", _show("slurm.env.USE_X=true"), 2, "quote it, e.g. USE_X: 'true'"),
    Case("env-nested-refused", "recipes", _show("slurm.env.X={a: 1}"), 2, "is not a string or number"),
    # ---- train ------------------------------------------------------------------------------
    Case("run-dir-is-file", "train", RUN, 2, "run: is a file, not a folder", _set("run", "my notes\n"), subprocess=True),
    Case("run-dir-root", "train", ("--recipe", T, "--run-dir", "/"), 2, "/: is the root or home folder"),
    Case("run-dir-home", "train", ("--recipe", T, "--run-dir", "{ws}/home"), 2, "is the root or home folder", lambda ws: ws.write("home/.bashrc", "x\n"), env={"HOME": "{ws}/home"}),
    Case("run-dir-user-files", "train", RUN, 2, "folder holds files that are not a run of this recipe (notes.txt, thesis.tex)", lambda ws: (ws.write("run/notes.txt", "a"), ws.write("run/thesis.tex", "b"))),
    Case("run-dir-user-files-resume", "train", RESUME, 2, "not a run of this recipe", lambda ws: ws.write("run/data.csv", "1,2\n")),
    Case("run-dir-other-recipe", "train", RUN, 2, "holds a run of recipe 'grpo-tiny-qwen3-cpu-fp8', not 'grpo-tiny-qwen3-cpu-bf16'", lambda ws: ws.run(recipe=FP8)),
    Case("run-dir-other-recipe-overwrite", "train", (*RUN, "--overwrite"), 2, "holds a run of recipe 'grpo-tiny-qwen3-cpu-fp8'", lambda ws: ws.run(recipe=FP8)),
    Case("fresh-over-same-recipe", "train", RUN, 2, "run: already holds a run of 'grpo-tiny-qwen3-cpu-bf16'; nothing was written. Fix: pass --resume to continue it, --overwrite", lambda ws: ws.run()),
    Case("resume-other-settings", "train", (*RESUME, "grpo.seed=7"), 2, "with different settings (data.train.seed: 1 -> 7; grpo.seed: 1 -> 7)", lambda ws: ws.run()),
    Case("resume-no-run-dir", "train", RESUME, 2, "--resume given but the folder does not exist"),
    Case("resume-empty-run-dir", "train", RESUME, 2, "--resume given but no run here yet", lambda ws: (ws.root / "run").mkdir()),
    Case("resume-no-checkpoint", "train", RESUME, 1, "--resume given but the run has no checkpoint", lambda ws: ws.run(steps=())),
    Case("resume-latest-deleted", "train", RESUME, 1, "latest: missing, so the newest checkpoint is unknown (step_2 present)", lambda ws: (ws.run() / "checkpoints/latest").unlink()),
    Case("resume-latest-dangling", "train", RESUME, 1, "names 'step_9', which is incomplete or missing", lambda ws: (ws.run() / "checkpoints/latest").write_text("step_9\n")),
    Case("resume-latest-escapes", "train", RESUME, 1, "which is incomplete or missing", lambda ws: (ws.run() / "checkpoints/latest").write_text("../../etc\n")),
    Case("resume-bit-flip", "train", RESUME, 1, "state.pt: fails its SHA-256 checksum (corrupted)", lambda ws: _flip_bit(ws.run() / "checkpoints/step_2/state.pt")),
    Case("resume-truncated", "train", RESUME, 1, "state.pt: ", lambda ws: _truncate(ws.run() / "checkpoints/step_2/state.pt")),
    Case("resume-info-edited", "train", RESUME, 1, "info.json: ", lambda ws: (ws.run() / "checkpoints/step_2/info.json").write_text('{"step": 99}')),
    Case("resume-no-manifest", "train", RESUME, 1, "manifest.json: missing or unreadable", lambda ws: (ws.run() / "checkpoints/step_2/manifest.json").unlink()),
    Case("resume-garbage-manifest", "train", RESUME, 1, "manifest.json: missing or unreadable", lambda ws: (ws.run() / "checkpoints/step_2/manifest.json").write_bytes(b"\x00\x01")),
    Case("resume-other-recipe-checkpoint", "train", RESUME, 1, "belongs to recipe 'grpo-tiny-qwen3-cpu-fp8', not 'grpo-tiny-qwen3-cpu-bf16'", _other_recipe_checkpoint),
    Case("resume-fewer-steps", "train", (*RESUME, "grpo.max_num_steps=1"), 2, "already completed 2 steps but grpo.max_num_steps is 1. Fix: set grpo.max_num_steps=2 or more", lambda ws: ws.run()),
    Case("saved-recipe-corrupt", "train", RESUME, 2, "recipe.yaml: cannot read the saved recipe", lambda ws: (ws.run() / "recipe.yaml").write_bytes(b"\xff\xfe: [")),
    Case("resume-and-overwrite", "train", (*RESUME, "--overwrite"), 2, "give one"),
    Case("unknown-flag", "train", (*RUN, "--fast"), 2, "unrecognized arguments: --fast"),
    Case("no-recipe-flag", "train", (), 2, "the following arguments are required: --recipe"),
    Case("untyped-value", "train", (*RUN, "grpo.num_prompts_per_step=abc"), 2, "expected integer, got string"),
    Case("gpu-recipe-local-engine", "train", ("--recipe", Q, "--engine", "local"), 3, "the local engine runs CPU recipes only"),
    Case("train-binary-recipe", "train", ("--recipe", "{ws}/bin.yaml", "--run-dir", "{ws}/run"), 2, "not a text file", _binary_recipe),
    Case("train-duplicate-key", "train", ("--recipe", "{ws}/r.yaml", "--run-dir", "{ws}/run"), 2, "duplicate key 'max_num_steps'", _recipe("grpo:\n  max_num_steps: 1\n  max_num_steps: 2\n")),
    Case("run-dir-empty-string", "train", ("--recipe", T, "--run-dir", ""), 2, "not a run of this recipe", lambda ws: ws.write("keep.txt", "x")),
    # ---- submit -----------------------------------------------------------------------------
    Case("account-empty", "submit", ("--recipe", T, "--account", "", "--dry-run"), 2, "--account: empty value"),
    Case("partition-blank", "submit", ("--recipe", T, "--partition", "  ", "--dry-run"), 2, "--partition: empty value"),
    Case("time-empty", "submit", ("--recipe", T, "--time", "", "--dry-run"), 2, "--time: empty value"),
    Case("job-name-empty", "submit", ("--recipe", T, "--job-name", "", "--dry-run"), 2, "--job-name: empty value"),
    Case("time-garbage", "submit", ("--recipe", T, "--time", "soon", "--dry-run"), 2, "soon"),
    Case("nodes-zero", "submit", ("--recipe", T, "--nodes", "0", "--dry-run"), 2, "--nodes: expected an integer >= 1"),
    Case("mounts-empty-item", "submit", ("--recipe", T, "--mounts", "a:b,,c:d", "--dry-run"), 2, "is not a mount"),
    Case("env-bad-name", "submit", ("--recipe", T, "slurm.env.1BAD=x", "--dry-run"), 2, "'1BAD' is not a valid environment variable name"),
    Case("env-int-submit", "submit", ("--recipe", T, "slurm.env.OMP_NUM_THREADS=8", "--dry-run"), 0, "", changes=True, stdout="export OMP_NUM_THREADS=8"),
    Case("submit-run-dir-file", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 2, "run: is a file, not a folder", _set("run", "x")),
    Case("submit-run-dir-other-recipe", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 2, "holds a run of recipe 'grpo-tiny-qwen3-cpu-fp8'", lambda ws: ws.run(recipe=FP8)),
    Case("submit-run-dir-user-files", "submit", ("--recipe", T, "--run-dir", "{ws}/run"), 2, "not a run of this recipe", lambda ws: ws.write("run/a.txt", "a")),
    Case("submit-bad-job-id", "submit", ("status", "abc;ls"), 1, "job id 'abc;ls': not a Slurm job id"),
    Case("submit-bad-override", "submit", ("--recipe", T, "grpo.seed=-5", "--dry-run"), 2, "grpo.seed: value -5 out of range"),
    # ---- compare ----------------------------------------------------------------------------
    Case("compare-run-with-itself", "compare", ("{ws}/bf16", "{ws}/bf16"), 2, "is the same run as", _compare_runs),
    Case("compare-run-with-itself-via-file", "compare", ("{ws}/bf16", "{ws}/bf16/metrics.jsonl"), 2, "is the same run as", _compare_runs),
    Case("compare-out-is-file", "compare", ("{ws}/bf16", "{ws}/fp8", "--out", "{ws}/report"), 2, "--out {ws}/report: is a file, not a folder", lambda ws: (_compare_runs(ws), ws.write("report", "mine"))),
    Case("compare-missing-run", "compare", ("{ws}/bf16", "{ws}/nope"), 2, "neither a run", _compare_runs),
    Case("compare-one-target", "compare", ("{ws}/bf16",), 2, "give two or more runs or recipes", _compare_runs),
    Case("compare-mixed", "compare", ("{ws}/bf16", T), 2, "either runs or recipes", _compare_runs),
    Case("compare-empty-run", "compare", ("{ws}/bf16", "{ws}/empty"), 2, "found neither metrics.jsonl nor TensorBoard event files", lambda ws: (_compare_runs(ws), (ws.root / "empty").mkdir())),
    Case("compare-binary-metrics", "compare", ("{ws}/bf16", "{ws}/bin/metrics.jsonl"), 2, "metrics.jsonl hold no metrics", lambda ws: (_compare_runs(ws), ws.write("bin/metrics.jsonl", bytes(range(256))))),
    Case("compare-override-on-runs", "compare", ("{ws}/bf16", "{ws}/fp8", "grpo.seed=1"), 2, "overrides apply to recipes only", _compare_runs),
    Case("compare-recipe-bad-override", "compare", (T, "tiny/grpo-tiny-qwen3-cpu-fp8", "policy.generation.top_k=-7"), 2, "top_k: value -7 out of range"),
    # ---- refit export -----------------------------------------------------------------------
    Case("export-nan-over-earlier", "refit", ("export", "{ws}/src", "{ws}/out"), 1, "model.layers.0.mlp.down_proj.weight: 1 of 49152 values are NaN/Inf. Fix: fix the source checkpoint; {ws}/out was left as it was", _hf_nan),
    Case("export-truncated", "refit", ("export", "{ws}/src", "{ws}/out"), 1, "model.safetensors: not a readable safetensors file, truncated or corrupted", lambda ws: _truncate(ws.hf() / "model.safetensors"), subprocess=True),
    Case("export-bit-flip-header", "refit", ("export", "{ws}/src", "{ws}/out"), 1, "not a readable safetensors file", lambda ws: _flip_bit(ws.hf() / "model.safetensors", 3)),
    Case("export-unrelated-folder", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "folder holds files that are not an earlier export (paper.pdf)", lambda ws: (ws.hf(), ws.write("out/paper.pdf", "x"))),
    Case("export-out-is-file", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "out: is a file, not a folder", lambda ws: (ws.hf(), ws.write("out", "x"))),
    Case("export-src-missing", "refit", ("export", "{ws}/nope", "{ws}/out"), 2, "no such file or folder"),
    Case("export-src-no-config", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "no config.json", lambda ws: (ws.hf() / "config.json").unlink()),
    Case("export-src-bad-json", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "config.json: not valid JSON", lambda ws: (ws.hf() / "config.json").write_text("{nope")),
    Case("export-src-quantized", "refit", ("export", "{ws}/out", "{ws}/out2"), 2, "already quantized (fp8)", lambda ws: ws.export("out")),
    Case("export-into-source", "refit", ("export", "{ws}/src", "{ws}/src"), 2, "is the source checkpoint", lambda ws: ws.hf()),
    Case("export-inside-source", "refit", ("export", "{ws}/src", "{ws}/src/fp8"), 2, "is the source checkpoint (or inside it)", lambda ws: ws.hf()),
    Case("export-no-safetensors", "refit", ("export", "{ws}/src", "{ws}/out"), 2, "no *.safetensors files", lambda ws: (ws.hf() / "model.safetensors").unlink()),
    Case("export-overrides-without-recipe", "refit", ("export", "{ws}/src", "{ws}/out", "grpo.seed=1"), 2, "key=value overrides need --recipe", lambda ws: ws.hf()),
    Case("export-shard-size-zero", "refit", ("export", "{ws}/src", "{ws}/out", "--shard-size-mb", "0"), 2, "--shard-size-mb must be >= 1", lambda ws: ws.hf()),
    Case("export-recipe-bad-override", "refit", ("export", "{ws}/src", "{ws}/out", "--recipe", T, "policy.generation.top_p=2"), 2, "top_p: value 2 out of range", lambda ws: ws.hf()),
    Case("export-binary-recipe", "refit", ("export", "{ws}/src", "{ws}/out", "--recipe", "{ws}/bin.yaml"), 2, "not a text file", lambda ws: (ws.hf(), _binary_recipe(ws))),
    Case("export-over-earlier-export", "refit", ("export", "{ws}/src", "{ws}/out"), 0, "", lambda ws: (ws.export("out"), ws.hf()), changes=True, stdout="wrote {ws}/out"),
]
# fmt: on
