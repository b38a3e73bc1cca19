"""FP8 active where the recipe says FP8, before launch: NeMo RL's FP8 patches reach the vLLM
executor the recipe's generation engine will use.

NeMo RL's `init_fp8` (quantization/fp8.py) makes vLLM's FP8 layers refittable by patching vLLM
in every vLLM worker process (`apply_fp8_patches`). How the patches get there depends on the
engine path:

* TP x PP = 1: `monkey_patch_vllm_ray_executor` applies them in the engine's own process;
* TP x PP > 1, synchronous engine: it wraps the `collective_rpc` of the Ray executor class it
  imports, so each Ray worker applies them before the model is built;
* TP x PP > 1, async engine (`vllm_cfg.async_engine`): `EngineCoreProc.run_engine_core` is
  patched to do the same inside the engine-core process.

vLLM picks the Ray executor class in `vllm/v1/executor/abstract.py` (`Executor.get_class`):
`RayExecutorV2` when `VLLM_USE_RAY_V2_EXECUTOR_BACKEND` is true, else `RayDistributedExecutor`.
The default flipped from "0" (vLLM 0.20) to "1" (vLLM 0.25), as NeMo RL's own
`vllm/patches.py` (main 7ea279a) records. A NeMo RL whose fp8.py wraps only
`RayDistributedExecutor` then serves an FP8 recipe without its patches and nothing says so
(NVIDIA-NeMo/RL#3755; fixed by PR #3754, after 7ea279a). The check reads which executor
classes fp8.py wraps from the tree's source, and which one vLLM will pick from the vLLM version
the tree pins and the recipe's `vllm_cfg.env_vars`.
"""

from __future__ import annotations

import ast

from nemo_fp8_rl.guards.context import VLLM, GuardContext, version_tuple
from nemo_fp8_rl.guards.findings import ERROR, CheckResult, Finding, source_of

CHECK = "fp8-active"
FP8_PY = "nemo_rl/models/generation/vllm/quantization/fp8.py"
ENV = "VLLM_USE_RAY_V2_EXECUTOR_BACKEND"
V2_DEFAULT_FROM = (0, 25)  # vLLM version whose default for ENV is "1"
UPSTREAM = "NVIDIA-NeMo/RL#3755 (fixed by PR #3754)"
APPLIES = "NeMo RL trees whose fp8.py wraps only RayDistributedExecutor (v0.7.0, main 7ea279a) with vLLM >= 0.25"


def patched_executors(fp8_source: str) -> set[str]:
    """The vLLM executor classes `monkey_patch_vllm_ray_executor` imports (and so wraps)."""
    tree = ast.parse(fp8_source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "monkey_patch_vllm_ray_executor":
            return {
                alias.name
                for inner in ast.walk(node)
                if isinstance(inner, ast.ImportFrom) and "executor" in (inner.module or "")
                for alias in inner.names
            }
    return set()


def selected_executor(vllm_version: str | None, env_value: str | None) -> str:
    """The Ray executor class vLLM picks (`Executor.get_class`) for a "ray" backend."""
    if env_value is not None:
        use_v2 = env_value.strip().lower() in ("1", "true")
    else:
        version = version_tuple(vllm_version)
        use_v2 = version is not None and version >= V2_DEFAULT_FROM
    return "RayExecutorV2" if use_v2 else "RayDistributedExecutor"


NEEDS_TREE = (
    f"it reads NeMo RL's {FP8_PY}, and NeMo RL is not installed here; run it where NeMo RL "
    "is (scripts/nemo-rl-env.sh /path/to/nemo-rl -- python -m nemo_fp8_rl.train --recipe R "
    "--preflight)"
)


def check(ctx: GuardContext) -> CheckResult:
    """Refuse an FP8 rollout whose vLLM executor NeMo RL's FP8 patches do not reach."""
    if not ctx.fp8_rollout:
        return CheckResult(CHECK, "no FP8 rollout (vllm_cfg.precision is not fp8)", skipped=True)
    source = ctx.nemo_rl.source(FP8_PY)
    if source is None:
        return CheckResult(CHECK, f"not run: {NEEDS_TREE}", skipped=True)
    tp = int(ctx.get(f"{VLLM}.tensor_parallel_size", 1))
    pp = int(ctx.get(f"{VLLM}.pipeline_parallel_size", 1))
    engine = "async engine" if ctx.get(f"{VLLM}.async_engine") else "sync engine"
    if tp * pp == 1:
        return CheckResult(CHECK, f"{engine}, vLLM TP x PP = 1: patches applied in-process")
    patched = patched_executors(source)
    env_value = ctx.vllm_env(ENV)
    chosen = selected_executor(ctx.nemo_rl.vllm, env_value)
    note = (
        f"{engine}, vLLM {ctx.nemo_rl.vllm} with TP x PP = {tp * pp} picks {chosen}; "
        f"NeMo RL's fp8.py wraps {', '.join(sorted(patched)) or 'no executor'}"
    )
    if chosen in patched:
        return CheckResult(CHECK, note)
    key = f"{VLLM}.env_vars.{ENV}"
    why = (
        f"= {env_value!r} in the recipe"
        if env_value is not None
        else (f"unset: its default in vLLM {ctx.nemo_rl.vllm}")
    )
    finding = Finding(
        f"{CHECK}/executor",
        ERROR,
        key,
        f"vLLM picks {chosen} ({ENV} {why}) but NeMo RL's FP8 patches wrap only "
        f"{', '.join(sorted(patched)) or 'no executor'} ({FP8_PY}, "
        "monkey_patch_vllm_ray_executor): vLLM's workers would build the FP8 model without "
        "them and the run would not be the FP8 run the recipe says",
        f"set {key}: '0' (vLLM's v1 Ray executor, which the patches wrap; NeMo RL's Qwen3.5 "
        "FP8 recipes do this), or use a NeMo RL with PR #3754",
        UPSTREAM,
        APPLIES,
        source_of(ctx.provenance, key),
    )
    return CheckResult(CHECK, note, [finding])
