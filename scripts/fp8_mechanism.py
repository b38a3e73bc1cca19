"""Controlled experiments: which engine factors make the FP8 ratio error compound.

Each variant starts from the same warm-up (seed 1), runs a few GRPO steps in-process
(the engine's Trainer and Rollout objects, no Ray) with BF16 shadow passes on every step and no
calibration, and reports, averaged over the steps:
- `prob_nmae = Σ|p̃ − p| / Σp` and `ratio_nmae = Σ|r̃ − r| / Σr` (trainer.shadow_metrics),
  their quotient `ratio_amplification` (the paper-style quotient: ≈ 2 even for one FP8 pass,
  since its two sides weigh tokens differently);
- `single_pass_nmae`: the ratio error one FP8 pass causes alone, weighted like `ratio_nmae`
  (`diagnostics.single_pass_nmae`), and `ratio_compounding = ratio_nmae / single_pass_nmae`,
  the measure of compounding: √2 ≈ 1.41 for independent errors of the two passes, 0 when they
  cancel;
- `rho`: correlation over tokens of the FP8 log-prob errors of the two passes,
  `e_old = lp8(θ_old) − lp16(θ_old)` and `e_cur = lp8(θ) − lp16(θ)`; the log-ratio error is
  `e_cur − e_old`, so rho near 1 means the errors cancel in the ratio;
- `bf16_lower_frac_neg`, `fp8_nominal_lower_frac_neg`: shares of negative-advantage tokens
  whose BF16 / FP8 ratio is below the nominal lower bound 1 − ε;
- `rel_err_over_nmae`: mean per-token |p̃/p − 1| over prob_nmae (how much more the ratio, a
  per-token quotient, weighs low-probability tokens than the probability NMAE does).
Only the project's bit-exact FP8 emulation produces the errors; the warm-up is the shipped one
(`data/warmup/`), so every machine starts from the same weights. Usage:
`uv run python scripts/fp8_mechanism.py [--steps 4] [--only NAME ...] [--out FILE]`, and
`--table FILE [--write docs/study/README.md]` for the Markdown table (written between the
`<!-- mechanism-table:begin -->` and `<!-- mechanism-table:end -->` markers). Errors are the
package's (`error: <where>: <what>. Fix: <how>`, exit 2 for bad input, 130 after Ctrl-C);
`--out` is appended to, never through a link, one whole line per finished variant.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from nemo_fp8_rl.cli.common import ArgumentParser, invoke, positive_int
from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.config.safe_files import open_append, read_text_bounded
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.engines.local.advantages import grpo_advantages
from nemo_fp8_rl.engines.local.batch import build_batch
from nemo_fp8_rl.engines.local.rollout import Rollout
from nemo_fp8_rl.engines.local.runner import _sampling_seed, prepare_model
from nemo_fp8_rl.engines.local.trainer import Trainer
from nemo_fp8_rl.study.doc_blocks import write_block
from nemo_fp8_rl.tiny.task import exact_match_reward, train_problems

PROG = "scripts/fp8_mechanism.py"
BASE = "tiny/grpo-tiny-qwen3-cpu-fp8-uncalibrated"
TW = "policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise"
LR3E5 = ["policy.megatron_cfg.optimizer.lr=3e-5", "policy.megatron_cfg.optimizer.min_lr=3e-5"]
VARIANTS: dict[str, list[str]] = {
    "blockwise (default)": [],
    "blockwise pow2 scales": ["policy.megatron_cfg.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES=0"],
    "blockwise E5M2 grads": ["policy.megatron_cfg.fp8_cfg.fp8=hybrid"],
    "blockwise 1 update/batch": ["policy.train_global_batch_size=256"],
    "blockwise 8 updates/batch": [
        "policy.train_global_batch_size=32",
        "policy.train_micro_batch_size=32",
    ],
    "blockwise lr 1e-5": [
        "policy.megatron_cfg.optimizer.lr=1e-5",
        "policy.megatron_cfg.optimizer.min_lr=1e-5",
    ],
    "blockwise lr 1e-3": [
        "policy.megatron_cfg.optimizer.lr=1e-3",
        "policy.megatron_cfg.optimizer.min_lr=1e-3",
    ],
    "blockwise BF16 rollout": ["policy.generation.vllm_cfg.precision=bfloat16"],
    "tensorwise": ["policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise"],
    "tensorwise logprob batch = micro batch": [
        "policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise",
        "policy.logprob_batch_size=64",
    ],
    "tensorwise micro batch 16": [
        "policy.megatron_cfg.fp8_cfg.fp8_recipe=tensorwise",
        "policy.train_micro_batch_size=16",
    ],
    "tensorwise 1 update/batch": [TW, "policy.train_global_batch_size=256"],
    "tensorwise 2 updates/batch": [TW, "policy.train_global_batch_size=128"],
    "tensorwise 2 updates/batch, logprob batch = micro batch": [
        TW,
        "policy.train_global_batch_size=128",
        "policy.logprob_batch_size=64",
    ],
    "tensorwise 2 updates/batch lr 3e-5": [TW, "policy.train_global_batch_size=128", *LR3E5],
    "blockwise 2 updates/batch lr 3e-5": ["policy.train_global_batch_size=128", *LR3E5],
    "tensorwise 4 updates/batch lr 3e-5": [TW, *LR3E5],
    "blockwise 4 updates/batch lr 3e-5": [*LR3E5],
    "tensorwise 2 updates/batch, micro batch 16": [
        TW,
        "policy.train_global_batch_size=128",
        "policy.train_micro_batch_size=16",
    ],
    "blockwise 2 updates/batch, micro batch 16": [
        "policy.train_global_batch_size=128",
        "policy.train_micro_batch_size=16",
    ],
    "blockwise 4 layers": ["local.model.num_layers=4"],
    "tensorwise 4 layers": [TW, "local.model.num_layers=4"],
}


class _Probe(Trainer):
    """The engine's trainer, keeping each step's shadow rows for the error correlation."""

    last_rows: list = []

    def _finish_calibration(self, step, shadow_rows):
        self.last_rows = shadow_rows
        return super()._finish_calibration(step, shadow_rows)


def _rho(rows: list[dict]) -> float:
    """corr(e_old, e_cur) over valid tokens of updates after the first (θ ≠ θ_old)."""
    if not rows:
        return float("nan")
    e_old, e_cur = [], []
    for r in rows:
        m = r["mask"] > 0
        e_old.append((r["fp8_prev"] - r["bf16_prev"])[m])
        e_cur.append((r["fp8_curr"] - r["bf16_curr"])[m])
    a, b = torch.cat(e_old).double(), torch.cat(e_cur).double()
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def run_variant(overrides: list[str], steps: int, run_dir) -> dict[str, float]:
    """`steps` GRPO steps of the variant; mean shadow metrics over the steps."""
    recipe = load_recipe(BASE, ["loss_fn.calibration.interval=1", *overrides], run_dir=run_dir)
    cfg, local = recipe.config, LocalConfig(**recipe.config["local"])
    prepare_model(recipe, run_dir, local)
    trainer, rollout = _Probe(cfg, str(run_dir / "model")), Rollout(cfg, str(run_dir / "model"))
    grpo = cfg["grpo"]
    group, n_prompts = grpo["num_generations_per_prompt"], grpo["num_prompts_per_step"]
    keys = (
        "prob_nmae",
        "ratio_nmae",
        "ratio_amplification",
        "single_pass_nmae",
        "ratio_compounding",
        "bf16_lower_frac_neg",
        "fp8_nominal_lower_frac_neg",
    )
    acc: dict[str, list[float]] = {k: [] for k in (*keys, "rho")}
    rel: list[torch.Tensor] = []
    for k in range(steps):
        rollout.apply_refit(trainer.refit_buckets())
        problems = train_problems(local.task, k, n_prompts)
        prompts = [p for p in problems.prompts for _ in range(group)]
        answers = [a for a in problems.answers for _ in range(group)]
        ids, mask, gen, texts = rollout.generate(prompts, _sampling_seed(grpo["seed"], k))
        adv = grpo_advantages(
            exact_match_reward(texts, answers), group, leave_one_out=True, normalize=True
        )
        m = trainer.train_step(build_batch(ids, mask, gen, adv), k)
        for key in keys:
            acc[key].append(m[f"train/{key}"])
        for r in trainer.last_rows:  # per-token relative error of p over prob NMAE, pooled
            rel.append(((r["fp8_curr"] - r["bf16_curr"]).exp() - 1).abs()[r["mask"] > 0])
        acc["rho"].append(_rho(trainer.last_rows[trainer.gbs // trainer.mbs :]))
    out = {k: sum(v) / len(v) for k, v in acc.items()}
    out["rel_err_over_nmae"] = float(torch.cat(rel).mean()) / out["prob_nmae"]
    return out


BEGIN, END = "<!-- mechanism-table:begin -->", "<!-- mechanism-table:end -->"


def table(path: Path) -> str:
    """Markdown table of a results JSONL (one row per variant, in file order)."""
    head = (
        "| Variant | steps | prob NMAE | ratio NMAE | paper-style quotient (ratio NMAE ÷ prob "
        "NMAE) | single-pass ratio error | compounding (ratio error ÷ single-pass error) "
        "| corr(e_old, e_cur) | BF16 share r<1−ε (A<0) | FP8 share r<1−ε (A<0) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    lines = read_text_bounded(path, MAX_RESULTS, "results file").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            rows.append(_row(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(
                f"{path}:{number}",
                f"not a result row of this script ({type(exc).__name__}: {exc})",
                "pass a JSONL file this script wrote with --out",
            ) from exc
    return "\n".join(rows)


MAX_RESULTS = 2**20  # one line per variant: far below a megabyte


def _row(d: dict) -> str:
    """One table row of a results line."""
    return (
        f"| {d['variant']} | {d.get('steps', '?')} | {d['prob_nmae']:.4f} | "
        f"{d['ratio_nmae']:.4f} | {d['ratio_amplification']:.2f} | "
        f"{d['single_pass_nmae']:.4f} | {d['ratio_compounding']:.2f} | {d['rho']:.2f} | "
        f"{d['bf16_lower_frac_neg']:.4f} | {d['fp8_nominal_lower_frac_neg']:.4f} |"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the variants (or print / splice the table of a results file); the exit code."""
    ap = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=4)
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", choices=list(VARIANTS))
    ap.add_argument("--out", default="/tmp/fp8_mechanism.jsonl")
    ap.add_argument("--table", help="only print the Markdown table of this JSONL file")
    ap.add_argument("--write", type=Path, help="with --table: splice it into this Markdown file")
    args = ap.parse_args(argv)
    if args.table:
        block = table(Path(args.table))
        if args.write:
            write_block(args.write, (BEGIN, END), block)
        else:
            print(block)
        return 0
    torch.set_num_threads(1)
    names = args.only or list(VARIANTS)
    open_append(Path(args.out)).close()  # refused before anything runs: a link, a pipe, a folder
    for name in names:
        t0 = time.perf_counter()
        print(f"running  {name} ({args.steps} steps)", flush=True)
        with tempfile.TemporaryDirectory(prefix="nemo-fp8-rl-mechanism-") as tmp:
            res = run_variant(VARIANTS[name], args.steps, Path(tmp))
        res["seconds"] = time.perf_counter() - t0
        line = {"variant": name, **res, "steps": args.steps}
        with open_append(Path(args.out)) as f:
            f.write(json.dumps(line) + "\n")
        print(f"{name:40s} " + " ".join(f"{k}={v:.4g}" for k, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(invoke(main, prog=PROG))
