"""What stops the NeMo RL engine before anything starts, in a module light enough to import
for a dry run or a submission (no torch, no NeMo RL): `runner.run` and
`engines.choose.check_engine` both ask `check_recipe`."""

from __future__ import annotations

from typing import Any

from nemo_fp8_rl.config import Recipe
from nemo_fp8_rl.config.engine_rules import nemo_engine_issues
from nemo_fp8_rl.engines.nemo.driver.async_loop import async_problems
from nemo_fp8_rl.engines.nemo.driver.platform import Platform, platform_for


class EngineConfigError(ValueError):
    """The recipe asks for something this engine cannot run; the message says what to change."""


def check_recipe(recipe: Recipe, platform: Platform | None = None, here: bool = True) -> list[str]:
    """Problems that stop this engine before anything starts (empty list: runnable): the
    platform's own first (default: the recipe's, `platform_for`), then the engine's rules
    (`config.engine_rules`, also checked at load for GPU recipes) and, `here`, what this
    machine's GPU cannot run (not for a job sent to other nodes)."""
    cfg = recipe.config
    problems = list((platform or platform_for(cfg)).problems(cfg))
    problems += [f"{i.key}: {i.problem}. Fix: {i.fix}" for i in nemo_engine_issues(cfg, {})]
    problems += async_problems(cfg)  # async GRPO runs NeMo RL's async_grpo_train (async_loop)
    if here:
        problems += [f"{i.key}: {i.problem}. Fix: {i.fix}" for i in gpu_issues(cfg)]
    return problems


def gpu_issues(cfg: dict[str, Any]) -> list[Any]:
    """Precision settings this machine's GPU cannot run (none when no GPU is visible here:
    a Slurm driver may sit on a node without one, and NeMo RL's workers check again)."""
    from nemo_fp8_rl.config.hardware import gpu_precision_issues, local_gpu

    gpu = local_gpu()
    return [] if gpu is None else gpu_precision_issues(cfg, gpu[0], gpu[1])
