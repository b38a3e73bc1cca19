"""Runs of NeMo RL's loop on CPU (`train --engine nemo` on a CPU recipe), read for evaluation.

Such a run is laid out as on a cluster: `checkpoints/step_<k>/training_info.json` (NeMo RL's
checkpoint manager) and `checkpoints/step_<k>/policy/weights/model.pt`, the CPU Megatron policy
worker's state dict (megatron-core names, FP32 master weights). Its model and data are the
embedded default's, handed over in `nemo-inputs/` (`tiny/handover.py`): the warm-started
tiny model as a Hugging Face folder and the training and validation problems as JSONL. So the
embedded engine's evaluation scores it exactly as an embedded run: the Megatron weights are
mapped back to Hugging Face names (`refit.names`, the mapping the refit uses), laid into the
handed-over model, and the problems it trained or validated on are left out of the held-out set.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from nemo_fp8_rl.config.placement import CPU, placement
from nemo_fp8_rl.config.user_error import UsageError
from nemo_fp8_rl.tiny import INPUTS

WEIGHTS = Path("policy") / "weights" / "model.pt"


def is_nemo_cpu_run(run_dir: Path) -> bool:
    """A run of NeMo RL's loop on CPU, as its `environment.json` records it: engine `nemo`,
    placement `cpu` (a run written before the file recorded its placement: the placement of
    its saved `recipe.yaml`)."""
    env = _json(run_dir / "environment.json")
    if env.get("engine") != "nemo":
        return False
    if "placement" in env:
        return env["placement"] == CPU
    try:
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(recipe, dict) and placement(recipe) == CPU


def _json(path: Path) -> dict:
    """The JSON object in `path` ({} when missing or not an object)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_dir(run_dir: Path) -> Path:
    """The handed-over tiny model (the policy before any GRPO step)."""
    return run_dir / INPUTS / "model"


def seen_prompts(run_dir: Path) -> set[str]:
    """Every prompt of the run's training and validation files (`{"input": ...}` per line)."""
    seen: set[str] = set()
    for name in ("train.jsonl", "validation.jsonl"):
        path = run_dir / INPUTS / name
        if not path.is_file():
            raise UsageError(
                path,
                "missing: the run's problems are needed to hold them out of the evaluation",
                "restore the file, or evaluate a complete run of NeMo RL's loop on CPU",
            )
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                seen.add(json.loads(line)["input"])
    return seen


def load_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Lay the checkpoint's Megatron weights into the HF `model`, mapped by `refit.names`;
    every parameter of the model must be set (a tied LM head comes with the embeddings)."""
    from nemo_fp8_rl.refit.names import AttentionLayout, megatron_to_engine

    path = checkpoint / WEIGHTS
    if not path.is_file():
        raise UsageError(
            path, "missing: the checkpoint holds no policy weights", "evaluate another checkpoint"
        )
    state = torch.load(path, map_location="cpu", weights_only=False)
    layout = AttentionLayout.from_hf_config(model.config)
    named = dict(megatron_to_engine(state.items(), layout))
    own = model.state_dict()
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in own if k not in named and not (tied and k == "lm_head.weight")]
    unknown = [k for k in named if k not in own]
    if missing or unknown:
        raise UsageError(
            path,
            f"does not match the run's model (missing {missing[:3]}, unknown {unknown[:3]})",
            "evaluate a checkpoint of this run",
        )
    with torch.no_grad():
        for name, tensor in named.items():
            own[name].copy_(tensor.to(own[name].dtype))
