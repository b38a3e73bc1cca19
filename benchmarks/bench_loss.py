"""Cost of the project loss (+ diagnostics) and of calibration, relative to a plain clipped loss.

    uv run python benchmarks/bench_loss.py [--tokens 1048576] [--repeats 5] [--threads 1]

Baseline, measured in the same process: the plain PPO clipped loss
`Σ_M max(−A·r, −A·clamp(r, 0.8, 1.2)) / Σ_M` with r = exp(lp − lp_prev), forward + backward.
Prints the median wall time of each variant and its ratio to the baseline; calibration is timed
per `observe` call (one micro-batch of `--tokens` tokens) and per `update` over the pooled tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nemo_fp8_rl.calibration import Calibrator
from nemo_fp8_rl.config.project import CalibrationConfig
from nemo_fp8_rl.loss import CalibratedClippedPGLoss

SEQ = 4096


def make_data(tokens: int, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A [B, SEQ+1] GRPO-like batch with `tokens` ≈ B·SEQ next-token positions."""
    g = torch.Generator().manual_seed(seed)
    b = max(1, tokens // SEQ)
    s = SEQ + 1
    gen = -torch.rand(b, s, generator=g) * 3
    prev = gen + 0.05 * torch.randn(b, s, generator=g)
    data = {
        "input_ids": torch.zeros(b, s, dtype=torch.long),
        "advantages": torch.randn(b, 1, generator=g).expand(b, s).contiguous(),
        "prev_logprobs": prev,
        "generation_logprobs": gen,
        "reference_policy_logprobs": prev + 0.05 * torch.randn(b, s, generator=g),
        "token_mask": (torch.rand(b, s, generator=g) > 0.1).float(),
        "sample_mask": torch.ones(b),
        "bf16_prev_logprobs": prev + 0.01 * torch.randn(b, s, generator=g),
    }
    curr = prev[:, 1:] + 0.1 * torch.randn(b, s - 1, generator=g)
    data["bf16_curr_logprobs"] = curr + 0.01 * torch.randn(b, s - 1, generator=g)
    return curr, data


def plain_clipped(lp: torch.Tensor, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """Baseline: the plain clipped surrogate, token mean over the mask."""
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    adv, r = data["advantages"][:, 1:], (lp - data["prev_logprobs"][:, 1:]).exp()
    per_token = torch.max(-adv * r, -adv * r.clamp(0.8, 1.2))
    return (per_token * mask).sum() / mask.sum()


def timed(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each `fn()` over `repeats` rounds after one warm-up round.

    Rounds interleave the variants so that load from other processes affects them alike.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def loss_variants(curr: torch.Tensor, data: dict) -> dict[str, Callable[[], object]]:
    """Forward + backward of the baseline and of the project loss in three configurations."""
    shadowless = {k: v for k, v in data.items() if not k.startswith("bf16_")}
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    gs, gt = data["sample_mask"].sum(), mask.sum()
    base_cfg = {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 2.0,
    }
    calibrated = CalibratedClippedPGLoss({**base_cfg, "calibration": {"enabled": True}})

    def run(loss_fn, batch) -> Callable[[], object]:
        def step() -> object:
            lp = curr.clone().requires_grad_()
            loss = loss_fn(lp, batch) if loss_fn is plain_clipped else loss_fn(lp, batch, gs, gt)[0]
            loss.backward()
            if loss_fn is calibrated:
                calibrated.calibrator._chunks.clear()  # keep the buffer from growing across repeats
                calibrated.calibrator._prob_sums = None
            return loss

        return step

    return {
        "plain clipped loss (baseline)": run(plain_clipped, shadowless),
        "project loss, NeMo RL defaults (KL, no IS)": run(CalibratedClippedPGLoss({}), shadowless),
        "project loss, TIS C=2 + all metrics": run(CalibratedClippedPGLoss(base_cfg), shadowless),
        "project loss, calibration step (observe)": run(calibrated, data),
    }


def calibration_costs(curr: torch.Tensor, data: dict, repeats: int) -> dict[str, float]:
    """Seconds per `observe` (one micro-batch) and per `update` (all pooled tokens).

    `update` is timed with the default pooling of windows behind L* (min_clipped_tokens 16) and
    with one window per update (`min_clipped_tokens = 0`), so their ratio is the pool's cost on a
    calibration step.
    """
    cal = Calibrator(CalibrationConfig(enabled=True, interval=1), 0.2, 0.2)
    plain = Calibrator(CalibrationConfig(enabled=True, interval=1, min_clipped_tokens=0), 0.2, 0.2)
    prev, mask = data["prev_logprobs"][:, 1:], data["token_mask"][:, 1:]
    kwargs = {
        "fp8_ratio": (curr - prev).exp(),
        "bf16_ratio": (data["bf16_curr_logprobs"] - data["bf16_prev_logprobs"][:, 1:]).exp(),
        "advantages": data["advantages"][:, 1:],
        "mask": mask,
        "fp8_logprobs": curr,
        "bf16_logprobs": data["bf16_curr_logprobs"],
    }
    step = [0]

    def update(c: Calibrator = cal) -> None:
        c.observe(**kwargs)
        c.update(step[0])
        step[0] += 1

    def observe() -> None:
        cal.observe(**kwargs)
        cal._chunks.clear()  # keep the buffer from growing across repeats
        cal._prob_sums = None

    return timed(
        {
            "observe": observe,
            "observe + update": update,
            "observe + update, one window": lambda: update(plain),
        },
        repeats,
    )


def main(argv: list[str] | None = None) -> int:
    """Print wall times and ratios to the baseline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    curr, data = make_data(args.tokens)
    n = int(curr.numel())
    print(
        f"{n} tokens ([{curr.shape[0]}, {curr.shape[1]}]), {args.threads} thread(s), median of {args.repeats}"
    )
    results = timed(loss_variants(curr, data), args.repeats)
    base = results["plain clipped loss (baseline)"]
    for name, sec in results.items():
        print(f"  {name:48s} {sec * 1e3:9.1f} ms   x{sec / base:5.2f}")
    costs = calibration_costs(curr, data, args.repeats)
    for name, sec in costs.items():
        print(f"  calibration {name:36s} {sec * 1e3:9.1f} ms   x{sec / base:5.2f}")
    pooled, single = costs["observe + update"], costs["observe + update, one window"]
    print(f"  pooled windows behind L*: update pooled / one window = x{pooled / single:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
