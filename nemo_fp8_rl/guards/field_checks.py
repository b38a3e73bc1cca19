"""Pre-launch checks for FP8 failures the field reported after the first catalogue: each reads
the recipe, the model's `config.json`, the workers' GPU or NeMo RL's source, and retires itself
on a NeMo RL tree whose source no longer has the cause (docs/guard-rails.md, "The checks").

* `kv-scales-refit` (NVIDIA-NeMo/RL PR #3226): the colocated refit (`stream_weights_via_ipc_zmq`)
  of NeMo RL v0.7.0 does not pass the trainer's FP8 KV-cache scales (`kv_scales`); vLLM then
  serves FP8 KV with its default scales. Judged from the call in `grpo.py` and
  `weight_sync/ipc_weight_synchronizer.py`.
* `hf-overrides` (NVIDIA-NeMo/RL PR #2904): v0.7.0's vLLM worker does
  `vllm_kwargs.update(init_fp8(...))`, replacing a user's `vllm_kwargs.hf_overrides` with FP8's;
  main 7ea279a merges them (`_merge_fp8_kwargs`, user keys win), so a user `quantization_config`
  there replaces FP8's own.
* `layer-parity` (prime-rl's ignore-pattern fix): NeMo RL's Megatron trainer runs every decoder
  linear layer in FP8 (it plumbs no BF16 layer setting to Transformer Engine); an FP8
  end-to-end recipe whose rollout keeps layers BF16 (`num_first/last_layers_in_bf16`,
  `quantization_ignored_layer_kws`) trains and samples those layers in different precisions.
* `pow2-on-hopper` (prime-rl PR #3112): power-of-2 scales on Hopper raised the mismatch KL from
  0.0038 to 0.0059; Hopper's kernels take FP32 scales.
* `zero-block-scales` (slime PR #2256, NVIDIA-NeMo/RL PR #3477): an all-zero block gives a NaN or
  infinite scale (block FP8: amax 0) or the E8M0 byte 0 FlashInfer's kernel rejects (MXFP8);
  judged from NeMo RL's quantizers (`torch.where(max_abs == 0` / `torch.where(scale == 0`).
  After every refit the served-precision check also reads the scales' values.
* `pp-scale-names` (ISEEKYAN/Megatron-LM PR #191): FP8 parameters (`fp8_param`) re-synced their
  scales under wrong names on pipeline stages > 0, leaving stale scales there (warning).
"""

from __future__ import annotations

import re
from pathlib import Path

from nemo_fp8_rl.config.gpus import HOPPER
from nemo_fp8_rl.guards.context import FP8_CFG, MCORE, VLLM, GuardContext
from nemo_fp8_rl.guards.findings import ERROR, WARNING, CheckResult, Finding, source_of
from nemo_fp8_rl.guards.scale_format import FP32, rollout_formats, trainer_format

FP8_PY = "nemo_rl/models/generation/vllm/quantization/fp8.py"
GRPO = "nemo_rl/algorithms/grpo.py"
IPC_SYNC = "nemo_rl/weight_sync/ipc_weight_synchronizer.py"
WORKER = "nemo_rl/models/generation/vllm/vllm_worker.py"
UPSTREAMS = {
    "kv-scales-refit": "NVIDIA-NeMo/RL PR #3226",
    "hf-overrides": "NVIDIA-NeMo/RL PR #2904",
    "layer-parity": "prime-rl ignore-pattern fix; NeMo RL additional_ignore",
    "pow2-on-hopper": "prime-rl PR #3112",
    "zero-block-scales": "slime PR #2256; NVIDIA-NeMo/RL PR #3477",
    "pp-scale-names": "ISEEKYAN/Megatron-LM PR #191",
}


def _finding(ctx: GuardContext, check: str, severity: str, key: str, what: str, fix: str,
             applies: str = "") -> Finding:  # fmt: skip
    return Finding(check, severity, key, what, fix, UPSTREAMS[check], applies,
                   source_of(ctx.provenance, key))  # fmt: skip


def ipc_calls_without_kv_scales(text: str) -> int:
    """How many `x = ....stream_weights_via_ipc_zmq(...)` calls in `text` pass no `kv_scales`."""
    calls = re.findall(r"=\s*[\w.]*\.stream_weights_via_ipc_zmq\(([^)]*)\)", text)  # not prose
    return sum("kv_scales" not in args for args in calls)


def tree_drops_kv_scales(tree: Path) -> bool:
    """True when the NeMo RL source tree at `tree` has a colocated refit call without
    `kv_scales` (`ipc_calls_without_kv_scales` over its grpo.py and IPC synchronizer)."""
    texts = [(tree / f).read_text() for f in (GRPO, IPC_SYNC) if (tree / f).is_file()]
    return sum(ipc_calls_without_kv_scales(t) for t in texts) > 0


def check_kv_scales_refit(ctx: GuardContext) -> CheckResult:
    """Refuse FP8 KV cache on a colocated refit that drops the trainer's KV scales."""
    name = "kv-scales-refit"
    if not (ctx.kv_fp8 and ctx.fp8_rollout):
        return CheckResult(name, "no FP8 KV cache", skipped=True)
    if not ctx.get("policy.generation.colocated.enabled", True):
        return CheckResult(name, "not colocated: the collective refit passes kv_scales")
    texts = [t for t in (ctx.nemo_rl.source(GRPO), ctx.nemo_rl.source(IPC_SYNC)) if t]
    if not texts:
        return CheckResult(
            name, "not run: it reads NeMo RL's grpo.py (NeMo RL not here)", skipped=True
        )
    if not sum(ipc_calls_without_kv_scales(t) for t in texts):
        return CheckResult(
            name, f"retired: the colocated refit passes kv_scales ({IPC_SYNC})", skipped=True
        )
    key = f"{VLLM}.kv_cache_dtype"
    what = ("colocated refit without the trainer's FP8 KV-cache scales: this NeMo RL calls "
            "stream_weights_via_ipc_zmq without kv_scales, so vLLM serves the FP8 KV cache with "
            "stale or default k/v scales")  # fmt: skip
    fix = "use NeMo RL main 7ea279a or later, or kv_cache_dtype: auto on this snapshot"
    return CheckResult(
        name, "kv_scales dropped", [_finding(ctx, name, ERROR, key, what, fix, "NeMo RL v0.7.0")]
    )


def check_hf_overrides(ctx: GuardContext) -> CheckResult:
    """Refuse a user `hf_overrides` that NeMo RL's FP8 set-up would drop or that drops FP8's."""
    name = "hf-overrides"
    user = ctx.get("policy.generation.vllm_kwargs.hf_overrides") or {}
    if not (ctx.fp8_rollout and user):
        return CheckResult(name, "no FP8 rollout with vllm_kwargs.hf_overrides", skipped=True)
    text = ctx.nemo_rl.source(WORKER)
    if text is None:
        return CheckResult(
            name, "not run: it reads NeMo RL's vllm_worker.py (NeMo RL not here)", skipped=True
        )
    key = "policy.generation.vllm_kwargs.hf_overrides"
    if "def _merge_fp8_kwargs" not in text:
        what = (f"NeMo RL's vLLM worker replaces vllm_kwargs with init_fp8's ({WORKER}: "
                f"vllm_kwargs.update(fp8_kwargs)), so your hf_overrides {sorted(user)} are dropped")  # fmt: skip
        fix = "use NeMo RL main 7ea279a or later (it merges them), or set the keys in the model's config"
        return CheckResult(
            name, "wiped", [_finding(ctx, name, ERROR, key, what, fix, "NeMo RL v0.7.0")]
        )
    if "quantization_config" in user:
        what = ("your hf_overrides.quantization_config replaces the one init_fp8 builds "
                "(_merge_fp8_kwargs: user keys win), so vLLM would not serve NeMo RL's FP8")  # fmt: skip
        fix = "drop hf_overrides.quantization_config; set FP8 through policy.generation.vllm_cfg"
        return CheckResult(
            name, "FP8 config replaced", [_finding(ctx, name, ERROR, key, what, fix)]
        )
    return CheckResult(name, f"merged: {sorted(user)} kept beside FP8's quantization_config")


def check_layer_parity(ctx: GuardContext) -> CheckResult:
    """Warn when an FP8 end-to-end recipe's rollout keeps layers BF16 that the trainer runs in
    FP8 (the trainer's BF16 set is empty: NeMo RL gives Megatron none)."""
    name = "layer-parity"
    if not (ctx.fp8_training and ctx.fp8_rollout):
        return CheckResult(name, "not FP8 end to end", skipped=True)
    kept = {k: ctx.get(f"{VLLM}.{k}") for k in
            ("num_first_layers_in_bf16", "num_last_layers_in_bf16", "quantization_ignored_layer_kws")}  # fmt: skip
    kept = {k: v for k, v in kept.items() if v}
    if not kept:
        return CheckResult(name, "trainer and rollout: every decoder linear layer in FP8")
    key = f"{VLLM}.{next(iter(kept))}"
    what = (f"the rollout keeps layers BF16 ({kept}) that the Megatron trainer runs in FP8 (NeMo "
            "RL passes no BF16 layer list to Transformer Engine): trainer and rollout run those "
            "layers in different precisions, which adds to the mismatch")  # fmt: skip
    fix = "drop the rollout's BF16 layers, or train in BF16 with an FP8 rollout only"
    return CheckResult(name, "sets differ", [_finding(ctx, name, WARNING, key, what, fix)])


def check_pow2_on_hopper(ctx: GuardContext) -> CheckResult:
    """Warn on power-of-2 scales for Hopper workers (named or assumed)."""
    name = "pow2-on-hopper"
    formats = dict(rollout_formats(ctx))
    trainer = trainer_format(ctx)
    if trainer is not None:
        formats[trainer[1]] = trainer[0]
    if not formats:
        return CheckResult(name, "BF16 recipe: no FP8 scales", skipped=True)
    if ctx.worker is None or ctx.worker.gpu.family != HOPPER:
        gpu = ctx.worker.gpu.name if ctx.worker else "not named"
        return CheckResult(name, f"workers: {gpu}: not Hopper", skipped=ctx.worker is None)
    pow2 = [k for k, f in formats.items() if f != FP32 and not k.endswith("is_mx")]
    if not pow2 or any(f == "E8M0" for f in formats.values()):
        return CheckResult(name, f"workers: {ctx.worker.gpu.name}: FP32 scales")
    what = (f"power-of-2 scales ({', '.join(k.split('.')[-1] for k in pow2)}) on "
            f"{ctx.worker.gpu.name} workers ({ctx.worker.how}): on Hopper they nearly doubled the "
            "train/rollout mismatch (mismatch KL 0.0038 -> 0.0059)")  # fmt: skip
    fix = ("FP32 scales on Hopper: NVTE_FP8_BLOCK_SCALING_FP32_SCALES: '1' and "
           "pow2_weight_scaling_factors / pow2_activation_scaling_factors: false")  # fmt: skip
    return CheckResult(
        name, "power-of-2 on Hopper", [_finding(ctx, name, WARNING, pow2[0], what, fix)]
    )


def check_zero_block_scales(ctx: GuardContext) -> CheckResult:
    """Refuse an FP8 rollout whose NeMo RL quantizer turns an all-zero block into a bad scale."""
    name = "zero-block-scales"
    if not ctx.fp8_rollout:
        return CheckResult(name, "no FP8 rollout", skipped=True)
    text = ctx.nemo_rl.source(FP8_PY)
    if text is None:
        return CheckResult(
            name, "not run: it reads NeMo RL's fp8.py (NeMo RL not here)", skipped=True
        )
    if ctx.is_mx and "def quantize_mxfp8_weight" not in text:
        return CheckResult(name, "this NeMo RL has no MXFP8 rollout (is_mx)", skipped=True)
    guard = "torch.where(scale == 0" if ctx.is_mx else "torch.where(max_abs == 0"
    if guard in text:
        return CheckResult(
            name, f"retired: {FP8_PY} maps all-zero blocks ({guard}...)", skipped=True
        )
    key = f"{VLLM}.is_mx" if ctx.is_mx else f"{VLLM}.precision"
    what = (f"this NeMo RL's quantizer ({FP8_PY}) has no all-zero-block case: a block of zeros "
            "gets a NaN/inf scale or the E8M0 byte 0 FlashInfer rejects, poisoning the served "
            "weights after the refit")  # fmt: skip
    fix = "use a NeMo RL with the fix (main 7ea279a has both cases), or refit.quantize_on: trainer"
    return CheckResult(name, "unguarded", [_finding(ctx, name, ERROR, key, what, fix)])


def check_pp_scale_names(ctx: GuardContext) -> CheckResult:
    """Warn on FP8 parameters over pipeline stages (scales re-synced by name per stage)."""
    name = "pp-scale-names"
    pp = int(ctx.get(f"{MCORE}.pipeline_model_parallel_size", 1))
    if not (ctx.fp8_training and ctx.get(f"{FP8_CFG}.fp8_param")):
        return CheckResult(name, "no FP8 parameters (fp8_param)", skipped=True)
    if pp <= 1:
        return CheckResult(name, "PP 1: one stage")
    key = f"{MCORE}.pipeline_model_parallel_size"
    what = (f"fp8_param with PP {pp}: FP8 scale re-sync by parameter name went wrong on stages "
            "> 0 (stale scales there) in a Megatron-LM fork; the served-precision check after "
            "each refit counts every stage's layers but cannot see a stale scale")  # fmt: skip
    fix = "fp8_param: false (the shipped recipes), or PP 1"
    return CheckResult(name, f"PP {pp}", [_finding(ctx, name, WARNING, key, what, fix)])
