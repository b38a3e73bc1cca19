"""The pre-launch guard rails (`nemo_fp8_rl.guards`) for a recipe, with what they read gathered
here: the model's `config.json`, the NeMo RL source tree, and the workers' GPU type.

`config.json` is the shipped copy (`model_configs/`, the preflight's offline Hub) or, for another
model, the local Hugging Face cache (never a download); the NeMo RL tree is the installed one
(`nemo_rl`'s parent folder) or none. The workers' GPU comes from `slurm.gpu` (which `--gpu`
sets) or the Slurm partition's GRES (`guards.worker_gpu`), never from this machine's GPU.
`train` (before Ray starts), `submit` (before sbatch) and the preflight run them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_fp8_rl.config.safe_files import read_text_bounded
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.guards.catalogue import guard_context, run_checks
from nemo_fp8_rl.guards.findings import GuardReport
from nemo_fp8_rl.guards.model_shapes import shape_problems
from nemo_fp8_rl.guards.worker_gpu import resolve_worker_gpu

MODEL_CONFIGS = Path(__file__).parents[1] / "model_configs"


def model_config(model_name: str) -> dict[str, Any] | None:
    """The model's `config.json` (shipped copy, else the local HF cache), or None; one that is
    not a JSON object of sensible shapes (`model_shapes.shape_problems`: a negative layer count,
    0 attention heads) is a located error before any estimate is made from it."""
    shipped = MODEL_CONFIGS / f"{model_name.replace('/', '--')}.json"
    if shipped.is_file():
        return _read_model_config(shipped)
    local = Path(model_name) / "config.json"
    if local.is_file():
        return _read_model_config(local)
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model_name, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, offline, no such repo: the checks skip
        return None
    return _read_model_config(Path(path))


def _read_model_config(path: Path) -> dict[str, Any]:
    """A model's config.json, read bounded and checked for sense (`model_config`)."""
    fix = (
        "restore the model's config.json (as the model's repository has it), or name another model"
    )
    try:
        hf = json.loads(read_text_bounded(path, 16 * 2**20, "config.json"))
    except ValueError as exc:
        raise UsageError(path, f"not JSON ({exc})", fix) from None
    if not isinstance(hf, dict):
        raise UsageError(path, f"a JSON {type(hf).__name__}, not an object", fix)
    problems = shape_problems(hf)
    if problems:
        raise UsageError(path, "impossible model shapes: " + "; ".join(problems[:5]), fix)
    return hf


def nemo_rl_tree() -> Path | None:
    """The installed NeMo RL's source tree (the folder holding `nemo_rl/`), or None."""
    try:
        import nemo_rl
    except ImportError:
        return None
    return Path(nemo_rl.__file__).resolve().parents[1]


def pre_launch_report(recipe: Any, tree: Path | None = None) -> GuardReport:
    """Every pre-launch check on `recipe` (`guards.catalogue.PRE_LAUNCH`)."""
    hf = model_config(recipe.config["policy"]["model_name"])
    worker = resolve_worker_gpu(recipe.config)
    ctx = guard_context(recipe, hf, tree if tree is not None else nemo_rl_tree(), worker)
    return run_checks(ctx, recipe.name)
