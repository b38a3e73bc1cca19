"""One FP8 scale format from trainer to rollout, the one the workers' GPU runs.

Scale formats (the value domain of the scales; E8M0 scales are powers of two):

| side | setting | format |
|---|---|---|
| trainer | `fp8_recipe: blockwise` + `NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1` | FP32 |
| trainer | `fp8_recipe: blockwise` without it (Transformer Engine's default) | power of 2 |
| trainer | `fp8_recipe: tensorwise` (`NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES=1`: power of 2) | FP32 |
| trainer | `fp8_recipe: mxfp8` | E8M0 |
| rollout | block FP8, `pow2_weight_scaling_factors` / `pow2_activation_scaling_factors` | power of 2 (else FP32) |
| rollout | `is_mx: true` | E8M0 |

Facts per GPU family (Transformer Engine, vLLM, NeMo RL; docs/guard-rails.md cites each):

* Hopper (9.x) has no MXFP8: `fp8_recipe: mxfp8` and `is_mx` need Blackwell.
* Blackwell (10.x, 12.x): TE emulates blockwise scaling with MXFP8 kernels, which need
  power-of-2 scales ("On Blackwell and newer, the FP8 block scaling recipe is emulated with
  MXFP8, which requires using power of two scaling factors", quantize_transpose_*_blockwise.cu);
  DeepGEMM's Blackwell path reads E8M0 scales, while NeMo RL's `use_deep_gemm` forces
  `VLLM_USE_DEEP_GEMM_E8M0=0` (FP32 scales): vLLM FP8 generation crashed in DeepGEMM's scale copy
  on GB200 (miles PR #1337), and FP32 scales rounded to E8M0 are not the trainer's (verl #6172).
* Both: the trainer's and the rollout's scales in one domain (all FP32, or all powers of 2), so
  a weight's FP8 image is quantized alike on both sides (NeMo RL #2081).

A recipe built for the other family is refused naming its sibling (`siblings`); the decision is
for the workers' GPU (`worker_gpu`), never the machine the check runs on.
"""

from __future__ import annotations

from nemo_fp8_rl.config.gpus import BLACKWELL, HOPPER
from nemo_fp8_rl.guards.context import FP8_CFG, MCORE, VLLM, GuardContext
from nemo_fp8_rl.guards.findings import ERROR, CheckResult, Finding, source_of
from nemo_fp8_rl.guards.siblings import FAMILY_NAMES, sibling_for

CHECK = "scale-format"
FP32, POW2, E8M0 = "FP32", "power-of-2", "E8M0"
UPSTREAM = "NVIDIA-NeMo/RL#2081; verl#6172; miles PR #1337; SkyRL PR #1898 review"
APPLIES = "every NeMo RL version with FP8 (v0.7.0, main 7ea279a)"
FP32_ENV = f"{MCORE}.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES"


def trainer_format(ctx: GuardContext) -> tuple[str, str] | None:
    """(format, key that decides it) of the trainer's FP8 scales; None when training is BF16."""
    recipe = ctx.fp8_recipe
    if recipe is None:
        return None
    if recipe == "mxfp8":
        return E8M0, f"{FP8_CFG}.fp8_recipe"
    if recipe == "blockwise":
        fp32 = ctx.megatron_env("NVTE_FP8_BLOCK_SCALING_FP32_SCALES") == "1"
        return (FP32 if fp32 else POW2), FP32_ENV
    pow2 = ctx.megatron_env("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES") == "1"
    return (POW2 if pow2 else FP32), f"{FP8_CFG}.fp8_recipe"


def rollout_formats(ctx: GuardContext) -> dict[str, str]:
    """{key: format} of the rollout's weight and activation scales; {} when rollout is BF16."""
    if not ctx.fp8_rollout:
        return {}
    if ctx.is_mx:
        return {f"{VLLM}.is_mx": E8M0}
    return {
        f"{VLLM}.{name}": POW2 if ctx.get(f"{VLLM}.{name}") else FP32
        for name in ("pow2_weight_scaling_factors", "pow2_activation_scaling_factors")
    }


def _domain(fmt: str) -> str:
    return FP32 if fmt == FP32 else POW2


def _finding(ctx: GuardContext, rule: str, key: str, what: str, fix: str) -> Finding:
    return Finding(
        f"{CHECK}/{rule}", ERROR, key, what, fix, UPSTREAM, APPLIES, source_of(ctx.provenance, key)
    )


def _consistency(ctx: GuardContext) -> list[Finding]:
    sides = dict(rollout_formats(ctx))
    trainer = trainer_format(ctx)
    if trainer is not None:
        sides[trainer[1]] = trainer[0]
    domains = {_domain(f) for f in sides.values()}
    if len(domains) < 2:
        return []
    listed = "; ".join(f"{k.split('.')[-1]}: {f}" for k, f in sides.items())
    key = next(
        k for k, f in sides.items() if _domain(f) != _domain(trainer[0] if trainer else FP32)
    )
    return [
        _finding(
            ctx,
            "mixed",
            key,
            f"the recipe mixes FP32 and power-of-2 scales ({listed}): the trainer and the rollout "
            "would quantize the same weight to different FP8 images",
            "one format: on Hopper FP32 everywhere (NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1', "
            "pow2_*_scaling_factors: false), or powers of 2 everywhere (no FP32 env var, "
            "pow2_weight_scaling_factors and pow2_activation_scaling_factors: true), as on Blackwell",
        )
    ]


def _for_family(ctx: GuardContext, family: str) -> list[tuple[str, str, str]]:
    """(rule, key, what) of each setting the family cannot run as the recipe means it."""
    out = []
    trainer = trainer_format(ctx)
    if family == HOPPER:
        if trainer and trainer[0] == E8M0:
            out.append(
                ("mxfp8-on-hopper", trainer[1], "MXFP8 training (E8M0 scales) needs Blackwell")
            )
        if ctx.is_mx:
            out.append(("mxfp8-on-hopper", f"{VLLM}.is_mx", "MXFP8 rollout needs Blackwell"))
    if family == BLACKWELL:
        if trainer and trainer[1] == FP32_ENV and trainer[0] == FP32:
            out.append(
                (
                    "fp32-on-blackwell",
                    FP32_ENV,
                    "FP32 block scales are Hopper-only: TE runs "
                    "blockwise FP8 on Blackwell with MXFP8 kernels, which need power-of-2 scales",
                )
            )
        deep_gemm = ctx.fp8_rollout and not ctx.is_mx and ctx.get(f"{VLLM}.use_deep_gemm")
        if deep_gemm and not ctx.get(f"{VLLM}.pow2_weight_scaling_factors"):
            out.append(
                (
                    "deepgemm-on-blackwell",
                    f"{VLLM}.use_deep_gemm",
                    "DeepGEMM on Blackwell reads "
                    "E8M0 scales, while use_deep_gemm makes NeMo RL set VLLM_USE_DEEP_GEMM_E8M0=0 and "
                    "the block scales are FP32",
                )
            )
    return out


def check(ctx: GuardContext) -> CheckResult:
    """Refuse mixed scale formats, and settings the workers' GPU family cannot run."""
    if not (ctx.fp8_rollout or ctx.fp8_training):
        return CheckResult(CHECK, "BF16 recipe: no FP8 scales", skipped=True)
    findings = _consistency(ctx)
    if ctx.worker is None:
        note = "workers' GPU not named (--gpu, slurm.gpu or slurm.partition): family rules not run"
        return CheckResult(CHECK, note, findings, skipped=not findings)
    gpu, family = ctx.worker.gpu, ctx.worker.gpu.family
    if gpu.capability < (8, 9):
        key = f"{FP8_CFG}.enabled" if ctx.fp8_training else f"{VLLM}.precision"
        findings.append(
            _finding(
                ctx,
                "no-fp8",
                key,
                f"FP8 needs compute capability 8.9+; the workers are {gpu.describe()}",
                "use the BF16 recipe on these GPUs, or Hopper/Blackwell workers",
            )
        )
        return CheckResult(CHECK, f"workers: {gpu.name} ({ctx.worker.how})", findings)
    wrong = _for_family(ctx, family)
    if wrong:
        other = HOPPER if family == BLACKWELL else BLACKWELL
        sibling = sibling_for(ctx.recipe_path, ctx.config, family) if ctx.recipe_path else None
        use = (
            f"use {sibling} (nemo_fp8_rl.recipes show {sibling}), its {FAMILY_NAMES[family]} sibling"
            if sibling
            else f"no {FAMILY_NAMES[family]} sibling recipe found next to this one: change the keys named"
        )
        for rule, key, what in wrong:
            findings.append(
                _finding(
                    ctx,
                    rule,
                    key,
                    f"{what}; the workers are {gpu.describe()} ({ctx.worker.how}): this recipe is "
                    f"for {FAMILY_NAMES[other]}",
                    use,
                )
            )
    return CheckResult(CHECK, f"workers: {gpu.name} ({ctx.worker.how})", findings)
