"""Estimated H100 GPU hours of the paper recipe set (`recipes/paper-fp8-rl/`), from the recipes;
and, with `--plan`, the plan of every GPU recipe: nodes, expected FP8 / BF16 step time, refit bytes.

    uv run python scripts/gpu_hours.py        # prints the table the README quotes
    uv run python scripts/gpu_hours.py --plan [PATTERN]

`--plan`, per recipe: nodes x GPUs (training and generation nodes when generation is not
colocated), the trajectory age of asynchronous GRPO, the expected FP8 / BF16 step time and its
source, and the bytes one refit sends (`refit.wire_bytes`: BF16 with NeMo RL's default
`quantize_on: generator`, FP8 pairs with `trainer`; the trainer / generator ratio beside it).
The step-time ratio is a published figure, not a measurement of the recipe: NeMo RL's
`docs/fp8.md` reports 15-25 % lower step time for end-to-end FP8 (blockwise linear layers,
Llama-3.1-8B-Instruct GRPO, one node, synchronous), i.e. FP8 / BF16 = 0.75-0.85, and NVIDIA's
end-to-end FP8 blog about 1.48x over BF16 with the FP8 KV cache and attention added (Qwen3-8B-Base),
i.e. 0.68. No published figure exists for the other models or for asynchronous GRPO; the plan
applies the Llama figure to every blockwise recipe and says so.

An estimate, not a measurement (nothing here has run on a GPU). Per GRPO step, with N model
parameters, S = num_prompts_per_step x num_generations_per_prompt samples, a prompt of P tokens
and a mean response of R = f x max_new_tokens tokens, T = S x (P + R) tokens:

    training FLOPs  = (6 + 2 + 2 [+ 2 with activation recompute]) x N x T
                      (forward + backward, prev log-probs, reference log-probs)
                      + 4 x N x T / K on calibrated runs (two BF16 shadow forwards every K steps)
    training time   = training FLOPs / (GPUs x MFU x 989e12 FLOP/s)   (H100 dense BF16)
    step time       = training time x (1 + g)     (g: generation time / training time)
    GPU hours       = steps x step time x GPUs / 3600

FP8 is given no speed-up (an upper bound for the FP8 runs). Evaluation (`nemo_fp8_rl.eval`,
math8 on the three benchmarks NeMo RL has: AIME24 30 x 16, AIME25 30 x 16, MATH-500 500 x 4
samples) adds samples x R tokens at the stated vLLM output rate per GPU, per evaluated checkpoint.
"""

from __future__ import annotations

from nemo_fp8_rl.config import find_recipes, load_recipe, short_name

PARAMS = {  # model cards: total parameters
    "Qwen/Qwen3-8B-Base": 8.2e9,
    "Qwen/Qwen3-14B-Base": 14.8e9,
    "Qwen/Qwen2.5-32B": 32.5e9,
}
PEAK = 989e12  # H100 SXM dense BF16 FLOP/s
MFU = 0.35  # model FLOPs utilisation of Megatron-Core training at these sizes (assumed)
PROMPT = 200  # tokens of a math prompt with NeMo RL's CoT template (assumed mean)
RESPONSE_FRACTION = 0.5  # mean response length / max_new_tokens (assumed)
GENERATION = 1.0  # g: generation time as a multiple of training time, colocated vLLM (assumed)
DAPO_OVERDRAW = 1.5  # dynamic sampling: mean extra generation rounds (batch_multiplier 3 caps it)
EVAL_SAMPLES = 30 * 16 + 30 * 16 + 500 * 4
EVAL_TOKENS_PER_GPU_S = 2500.0  # vLLM output tokens/s per GPU (assumed)


def estimate(cfg: dict) -> dict[str, float]:
    """GPU hours of training one recipe, and of evaluating one checkpoint of it."""
    n = PARAMS[cfg["policy"]["model_name"]]
    g = cfg["grpo"]
    samples = g["num_prompts_per_step"] * g["num_generations_per_prompt"]
    response = RESPONSE_FRACTION * cfg["policy"]["generation"]["max_new_tokens"]
    tokens = samples * (PROMPT + response)
    factor = 10 + (2 if cfg["policy"]["megatron_cfg"]["activation_checkpointing"] else 0)
    cal = cfg["loss_fn"]["calibration"]
    if cal["enabled"]:
        factor += 4 / cal["interval"]
    gpus = cfg["cluster"]["num_nodes"] * cfg["cluster"]["gpus_per_node"]
    train_s = factor * n * tokens / (gpus * MFU * PEAK)
    gen = GENERATION * (DAPO_OVERDRAW if g["use_dynamic_sampling"] else 1.0)
    step_s = train_s * (1 + gen)
    hours = g["max_num_steps"] * step_s * gpus / 3600
    eval_h = EVAL_SAMPLES * response / EVAL_TOKENS_PER_GPU_S / 3600
    return {
        "gpus": gpus,
        "steps": g["max_num_steps"],
        "step_s": step_s,
        "hours": hours,
        "eval_h": eval_h,
    }


# Published FP8 / BF16 step-time ratios: (low, high, source).
FP8_LINEAR = (0.75, 0.85, "NeMo RL docs/fp8.md: 15-25 % lower step time, Llama-3.1-8B 1n8g sync")
FP8_KV = (1 / 1.48, 1 / 1.48, "NVIDIA e2e FP8 blog: ~1.48x over BF16 with FP8 KV + attention")


def step_ratio(cfg: dict) -> tuple[float, float, str] | None:
    """The published FP8 / BF16 step-time ratio that applies to a recipe (None for BF16)."""
    if cfg["policy"]["generation"]["vllm_cfg"]["precision"] != "fp8":
        return None
    if cfg["policy"]["generation"]["vllm_cfg"]["kv_cache_dtype"].startswith("fp8"):
        return FP8_KV
    low, high, source = FP8_LINEAR
    same = cfg["policy"]["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    sync = not cfg["grpo"]["async_grpo"]["enabled"]
    block = cfg["policy"]["megatron_cfg"]["fp8_cfg"]["fp8_recipe"] == "blockwise"
    exact = same and sync and block and cfg["cluster"]["num_nodes"] == 1
    return low, high, source + ("" if exact else "; applied here by extrapolation")


def plan_row(cfg: dict) -> dict:
    """One recipe's plan: nodes, async age, expected FP8 / BF16 step time, refit bytes."""
    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import model_config
    from nemo_fp8_rl.refit.wire_bytes import wire_bytes

    cluster, gen = cfg["cluster"], cfg["policy"]["generation"]["colocated"]
    nodes = f"{cluster['num_nodes']}x{cluster['gpus_per_node']}"
    if not gen["enabled"]:
        g = gen["resources"]["num_nodes"]
        nodes += f" ({cluster['num_nodes'] - g} train + {g} generate)"
    a = cfg["grpo"]["async_grpo"]
    trainer, generator, _ = wire_bytes(model_config(cfg["policy"]["model_name"]))
    on_trainer = cfg["refit"]["quantize_on"] == "trainer"
    return {
        "nodes": nodes,
        "async": f"{a['max_trajectory_age_steps']}-off" if a["enabled"] else "sync",
        "ratio": step_ratio(cfg),
        "refit_gib": (trainer if on_trainer else generator) / 2**30,
        "trainer_over_generator": trainer / generator,
    }


def plan(pattern: str = "") -> None:
    """Print the plan of every GPU recipe whose name contains `pattern`."""
    print(
        f"{'recipe':<70} {'nodes':<28} {'GRPO':<6} {'FP8/BF16 step':<14} {'refit GiB':>9} "
        f"{'trainer/gen':>11}  source"
    )
    for path in find_recipes():
        name = short_name(path)
        cfg = load_recipe(path).config
        if pattern not in name or cfg["cluster"]["gpus_per_node"] == 0:
            continue
        row = plan_row(cfg)
        r = row["ratio"]
        shown = "-" if r is None else (f"{r[0]:.2f}" if r[0] == r[1] else f"{r[0]:.2f}-{r[1]:.2f}")
        print(
            f"{name:<70} {row['nodes']:<28} {row['async']:<6} {shown:<14} "
            f"{row['refit_gib']:>9.2f} {row['trainer_over_generator']:>11.3f}  "
            + ("" if r is None else r[2])
        )


def main() -> None:
    """Print one row per paper recipe and the totals (`--plan [PATTERN]`: the recipe plan)."""
    import sys

    if sys.argv[1:2] == ["--plan"]:
        plan(sys.argv[2] if len(sys.argv) > 2 else "")
        return
    print(
        f"assumptions: MFU {MFU}, peak {PEAK:.3g} FLOP/s, prompt {PROMPT} tokens, mean response "
        f"{RESPONSE_FRACTION} x max_new_tokens, generation = {GENERATION} x training, "
        f"eval {EVAL_TOKENS_PER_GPU_S:.0f} tokens/s/GPU"
    )
    print(f"{'recipe':<78} {'GPUs':>4} {'steps':>5} {'step s':>7} {'GPU h':>7} {'eval GPU h':>10}")
    total = total_eval = 0.0
    for path in find_recipes():
        if "paper-fp8-rl" not in path.parts:
            continue
        e = estimate(load_recipe(path).config)
        total += e["hours"]
        total_eval += e["eval_h"]
        print(
            f"{short_name(path):<78} {e['gpus']:>4} {e['steps']:>5} {e['step_s']:>7.0f} "
            f"{e['hours']:>7.0f} {e['eval_h']:>10.1f}"
        )
    print(
        f"total: {total:.0f} GPU hours of training, {total_eval:.1f} GPU hours per evaluated "
        "checkpoint of every run (math8, the benchmarks NeMo RL has)"
    )


if __name__ == "__main__":
    main()
