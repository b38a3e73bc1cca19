"""Estimated H100 GPU hours of the paper recipe set (`recipes/paper-fp8-rl/`), from the recipes.

    uv run python scripts/gpu_hours.py        # prints the table the README quotes

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


def main() -> None:
    """Print one row per paper recipe and the totals."""
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
