"""A trained checkpoint of the embedded engine as a BF16 Hugging Face folder (for `refit export`).

A run directory holds the model it started from as a Hugging Face checkpoint (`model/`: config,
tokenizer, initial weights) and the trained weights in each checkpoint's `state.pt` (the
trainer's masters under `trainer.model`, HF parameter names). `write_hf_folder` verifies the
checkpoint against its manifest, then writes `model/`'s config and tokenizer files with the
trained weights in BF16 (tied embeddings saved once, as `model/` saves them).
"""

from __future__ import annotations

from pathlib import Path

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.engines.local.checkpoint import load_checkpoint, verify_checkpoint

WEIGHTS = "model.safetensors"


def write_hf_folder(checkpoint: Path, dest: Path) -> Path:
    """Write the trained weights of `checkpoint` (`<run>/checkpoints/step_N`) with the run's
    `model/` config and tokenizer into the new folder `dest`; returns `dest`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir = checkpoint.parent.parent / "model"
    verify_checkpoint(checkpoint)
    state, _ = load_checkpoint(checkpoint)
    trained = state["trainer"]["model"]
    with safe_open(str(model_dir / WEIGHTS), "pt") as initial:
        names = list(initial.keys())  # what the HF folder holds (a tied lm_head is left out)
    dest.mkdir(parents=True)
    for item in model_dir.iterdir():
        if item.is_file() and item.name != WEIGHTS:
            write_atomic(dest / item.name, item.read_bytes())
    tensors = {n: trained[n].detach().to(torch.bfloat16).contiguous() for n in names}
    save_file(tensors, str(dest / WEIGHTS), metadata={"format": "pt"})  # safe-write: private
    return dest
