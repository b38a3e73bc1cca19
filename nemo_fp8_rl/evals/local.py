"""CPU evaluation of an embedded-engine run: the tiny checkpoint on held-out and harder sums.

The checkpoint's policy (the trainer's master weights, or the warm-started `model/` for
`step_0`) is cast to BF16 and evaluated the same way for every run, BF16 or FP8: the suite's
sampling, `samples_per_problem` samples per problem, reward = exact match (the training reward).
Problems come from a fixed seed per benchmark; `add2-heldout` leaves out every prompt the run
trained or validated on (its training prompts are a function of seed and step, so they are known).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.project import TaskConfig
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.evals.checkpoints import Selection
from nemo_fp8_rl.evals.results import BenchmarkScore
from nemo_fp8_rl.evals.suites import Benchmark, Suite

SEED = 9_001  # problem draws and sampling of the addition suite


def load_policy(run_dir: Path, config: dict[str, Any], selection: Selection):
    """(model in BF16, tokenizer) of the selected checkpoint."""
    from nemo_fp8_rl.engines.local.checkpoint import load_checkpoint, verify_checkpoint
    from nemo_fp8_rl.evals import nemo_cpu
    from nemo_fp8_rl.tiny.model import policy_from_config, quiet_transformers

    if nemo_cpu.is_nemo_cpu_run(run_dir):  # NeMo RL's loop on CPU: Megatron-named weights
        quiet_transformers()
        model, tokenizer = policy_from_config(config, str(nemo_cpu.model_dir(run_dir)))
        if selection.step > 0:
            nemo_cpu.load_weights(model, selection.path)
        return model.to(torch.bfloat16).eval(), tokenizer
    trained = selection.step > 0 or selection.path.name.startswith("step_")
    if trained:
        verify_checkpoint(selection.path)  # a corrupted state.pt is refused, never scored
    quiet_transformers()
    model, tokenizer = policy_from_config(config, str(run_dir / "model"))
    if trained:
        state, _ = load_checkpoint(selection.path)
        model.load_state_dict(state["trainer"]["model"])
    return model.to(torch.bfloat16).eval(), tokenizer


def seen_prompts(config: dict[str, Any]) -> set[str]:
    """Every prompt the run trained on (all steps) or validated on."""
    from nemo_fp8_rl.tiny.task import train_problems, validation_problems

    task = TaskConfig(**config["local"]["task"])
    n, steps = config["grpo"]["num_prompts_per_step"], config["grpo"]["max_num_steps"]
    seen = set(validation_problems(task).prompts)
    for step in range(steps):
        seen.update(train_problems(task, step, n).prompts)
    return seen


def check_count(bench: Benchmark, count: int, exclude: set[str]) -> None:
    """Refuse more problems than `bench` has distinct ones outside `exclude` (the draw below
    would never finish); `exclude` holds prompts of the same operand digits."""
    available = 10 ** (2 * bench.digits) - len(exclude)
    if count > available:
        raise UsageError(
            f"--num-problems {count}",
            f"{bench.name} has {available:,} distinct {bench.digits}-digit problems the run has "
            "not trained or validated on",
            f"give at most {available:,}",
        )


def problems(bench: Benchmark, count: int, exclude: set[str]) -> tuple[list[str], list[str]]:
    """`count` distinct problems with `bench.digits`-digit operands, none in `exclude`."""
    from nemo_fp8_rl.tiny.task import sample_problems

    gen = torch.Generator().manual_seed(SEED + bench.digits)
    cfg = TaskConfig(digits=bench.digits)
    prompts: dict[str, str] = {}
    for _ in range(200):
        draw = sample_problems(cfg, 4 * count, gen)
        for p, a in zip(draw.prompts, draw.answers, strict=True):
            if p not in exclude and len(prompts) < count:
                prompts.setdefault(p, a)
        if len(prompts) == count:
            return list(prompts), list(prompts.values())
    raise ValueError(
        f"{bench.name}: only {len(prompts)} {bench.digits}-digit problems were not seen in "
        f"training; lower the suite's problem count"
    )


def score(
    model, tokenizer, prompts: list[str], answers: list[str], bench: Benchmark, suite: Suite
) -> tuple[float, list[int]]:
    """avg@n (mean exact-match reward over `bench.samples` samples of each problem) and the
    number of correct samples of each problem."""
    from nemo_fp8_rl.tiny.sampling import SamplingParams, generate
    from nemo_fp8_rl.tiny.task import exact_match_reward
    from nemo_fp8_rl.tiny.tokenizer import decode_completions, encode_prompts

    n = bench.samples
    ids, mask = encode_prompts(tokenizer, [p for p in prompts for _ in range(n)])
    s = suite.sampling
    params = SamplingParams(bench.digits + 2, s.temperature, s.top_p, s.top_k)
    with torch.no_grad():
        gen = generate(
            model,
            ids,
            mask,
            params,
            torch.Generator().manual_seed(SEED),
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
        )
    texts = decode_completions(tokenizer, gen.response_ids)
    rewards = exact_match_reward(texts, [a for a in answers for _ in range(n)])
    correct = rewards.view(len(prompts), n).sum(1).round().to(torch.int64).tolist()
    return float(rewards.mean()), correct


def evaluate(
    run_dir: Path, config: dict[str, Any], selection: Selection, suite: Suite
) -> tuple[dict[str, BenchmarkScore], dict[str, Any]]:
    """Scores of every benchmark of `suite`, and the sampling settings used."""
    from nemo_fp8_rl.evals import nemo_cpu

    nemo = nemo_cpu.is_nemo_cpu_run(run_dir)
    seen = nemo_cpu.seen_prompts(run_dir) if nemo else seen_prompts(config)
    excluded = {
        b.name: seen if b.digits == config["local"]["task"]["digits"] else set()
        for b in suite.benchmarks
    }
    for bench in suite.benchmarks:
        check_count(bench, suite.num_problems, excluded[bench.name])
    torch.manual_seed(SEED)
    model, tokenizer = load_policy(run_dir, config, selection)
    out = {}
    for bench in suite.benchmarks:
        t0 = time.perf_counter()
        exclude = excluded[bench.name]
        prompts, answers = problems(bench, suite.num_problems, exclude)
        value, correct = score(model, tokenizer, prompts, answers, bench, suite)
        dataset = f"addition-{bench.digits}d-seed{SEED}"
        out[bench.name] = BenchmarkScore(
            bench.title, value, len(prompts), bench.samples, dataset, correct, suite.pass_ks
        )
        print(
            f"  {bench.name}: {value:.3f} (avg@{bench.samples}, {time.perf_counter() - t0:.1f} s)"
        )
    s = suite.sampling
    sampling = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "max_new_tokens": "operand digits + 2",
        "weights": "bfloat16",
    }
    return out, sampling
