"""What stops the NeMo RL engine before anything starts, in a module light enough to import
for a dry run or a submission (no torch, no NeMo RL): `runner.run` and
`engines.choose.check_engine` both ask `check_recipe`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nemo_fp8_rl.config import Problem, Recipe
from nemo_fp8_rl.config.engine_rules import nemo_engine_issues
from nemo_fp8_rl.config.user_error import USAGE, ProblemsError
from nemo_fp8_rl.engines.nemo.driver.async_loop import async_problems
from nemo_fp8_rl.engines.nemo.driver.platform import Platform, platform_for


class EngineConfigError(ProblemsError, ValueError):
    """The recipe asks for something this engine cannot run: where, what, the problems found (each
    with its fix) or the one fix."""

    code = USAGE

    def __init__(
        self, where: str, what: str, problems: list[str] | None = None, fix: str = ""
    ) -> None:
        super().__init__(where, what, problems or [], fix)


def check_recipe(recipe: Recipe, platform: Platform | None = None, here: bool = True) -> list[str]:
    """Problems that stop this engine before anything starts (empty list: runnable): the
    platform's own first (default: the recipe's, `platform_for`), then the engine's rules
    (`config.engine_rules`, also checked at load for GPU recipes) and, `here` (a run started
    from this process, not a submission, whose gate reports them itself), the guard rails for
    the workers' GPU type and, when the recipe names no workers' GPU, what this machine's GPU
    cannot run."""
    cfg = recipe.config
    problems = list((platform or platform_for(cfg)).problems(cfg))
    problems += [unsourced(i) for i in nemo_engine_issues(cfg, {})]
    problems += async_problems(cfg)  # async GRPO runs NeMo RL's async_grpo_train (async_loop)
    if not here:  # a submission: its guard gate or preflight reports the guard rails in full
        return problems
    problems += guard_errors(recipe)
    if not workers_named(cfg):
        problems += [unsourced(i) for i in gpu_issues(cfg)]
    return problems


def unsourced(problem: Problem) -> str:
    """One line of the engine's refusal: the problem without the file that set its key."""
    return replace(problem, file=None).render()


def workers_named(cfg: dict[str, Any]) -> bool:
    """Whether the recipe says where its workers run (`slurm.gpu` or `slurm.partition`): then
    the guard rails decide for that GPU type and this machine's GPU is not asked."""
    slurm = cfg.get("slurm") or {}
    return bool(slurm.get("gpu") or slurm.get("partition"))


def guard_errors(recipe: Recipe) -> list[str]:
    """The pre-launch guard rails' errors (`guard_rails`): decided for the workers' GPU type
    (`slurm.gpu`, `--gpu`, the partition), never this machine's, which may be a GPU-less head
    node or another GPU; warnings are printed, not refused."""
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import pre_launch_report

    report = pre_launch_report(recipe)
    for finding in report.warnings:
        print(finding.line(), flush=True)
    assumed = [r.note for r in report.results if "assumed:" in r.note]
    for line in [*assumed, report.not_run]:
        if line:
            print(f"note: guard rails: {line}", flush=True)
    return [f.problem(versions=False, source=False).render() for f in report.errors]


def gpu_issues(cfg: dict[str, Any]) -> list[Any]:
    """Precision settings this machine's GPU cannot run (none when no GPU is visible here:
    a Slurm driver may sit on a node without one, and NeMo RL's workers check again)."""
    from nemo_fp8_rl.config.hardware import gpu_precision_issues, local_gpu

    gpu = local_gpu()
    return [] if gpu is None else gpu_precision_issues(cfg, gpu[0], gpu[1])
