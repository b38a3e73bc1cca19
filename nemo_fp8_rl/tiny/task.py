"""Synthetic verifiable task: n-digit addition with exact-match reward.

Problem: draw `a, b` uniformly from `[0, 10^n - 1]`; prompt `"a+b="`; answer `str(a + b)`.
Reward: the completion's characters up to the first non-digit must equal the answer (1.0),
else 0.0. Train prompts are drawn per step from a generator seeded by (train_seed, step), so a
resumed run sees exactly the prompts an uninterrupted one would; the validation split is a
fixed set drawn from `validation_seed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_fp8_rl.config.project import TaskConfig


@dataclass(frozen=True)
class Problems:
    """A batch of problems: prompts and their exact answers."""

    prompts: list[str]
    answers: list[str]


def sample_problems(cfg: TaskConfig, n: int, generator: torch.Generator) -> Problems:
    """Draw `n` addition problems with `cfg.digits`-digit operands from `generator`."""
    high = 10**cfg.digits
    ab = torch.randint(0, high, (n, 2), generator=generator).tolist()
    return Problems(prompts=[f"{a}+{b}=" for a, b in ab], answers=[str(a + b) for a, b in ab])


def train_problems(cfg: TaskConfig, step: int, n: int) -> Problems:
    """The `n` training prompts of GRPO step `step` (a pure function of seed and step)."""
    gen = torch.Generator().manual_seed(cfg.train_seed * 1_000_003 + step)
    return sample_problems(cfg, n, gen)


def validation_problems(cfg: TaskConfig) -> Problems:
    """The fixed validation split (`cfg.num_validation` problems from `cfg.validation_seed`)."""
    gen = torch.Generator().manual_seed(cfg.validation_seed)
    return sample_problems(cfg, cfg.num_validation, gen)


def exact_match_reward(completions: list[str], answers: list[str]) -> torch.Tensor:
    """Reward 1.0 where the leading digits of the completion equal the answer, else 0.0."""
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions for {len(answers)} answers")
    rewards = []
    for text, answer in zip(completions, answers, strict=True):
        digits = ""
        for ch in text:
            if not ch.isdigit():
                break
            digits += ch
        rewards.append(1.0 if digits == answer else 0.0)
    return torch.tensor(rewards, dtype=torch.float32)
