"""What `refit export SRC` converts, told from the folder before anything heavy is imported.

- a Hugging Face checkpoint folder (`config.json` with safetensors): as it is;
- a checkpoint of the embedded engine (`<run>/checkpoints/step_N`, with `state.pt`), or its
  run folder (`<run>`: the latest checkpoint): the trained weights, written first as a BF16
  Hugging Face folder beside the output (`engines.local.hf_export`);
- a NeMo RL (Megatron) checkpoint is refused with the converter to run first.
"""

from __future__ import annotations

from pathlib import Path

from nemo_fp8_rl.config.user_error import UsageError

HF = "hf"
TRAINED = "trained"
FIX = (
    "pass a Hugging Face checkpoint folder (config.json + safetensors), an embedded run's "
    "checkpoint (runs/<name>/checkpoints/step_N) or its run folder (runs/<name>)"
)


def _latest(run: Path) -> Path:
    """The checkpoint `<run>/checkpoints/latest` names."""
    pointer = run / "checkpoints" / "latest"
    name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    if not name or "/" in name or not (run / "checkpoints" / name / "state.pt").is_file():
        raise UsageError(
            str(run), "is a run folder without a complete checkpoint", "train it further, or " + FIX
        )
    return run / "checkpoints" / name


def classify(src: Path) -> tuple[str, Path]:
    """(`HF` or `TRAINED`, the folder to read), or a `UsageError` saying what `src` is."""
    if not src.exists():
        raise UsageError(str(src), "no such file or folder", FIX)
    if not src.is_dir():
        raise UsageError(str(src), "is a file, not a checkpoint folder", FIX)
    if (src / "config.json").is_file():
        return HF, src
    if (src / "state.pt").is_file():
        if not (src.parent.parent / "model" / "config.json").is_file():
            raise UsageError(
                str(src),
                f"is a checkpoint whose run has no model/config.json ({src.parent.parent})",
                "export from the run folder the checkpoint was trained in",
            )
        return TRAINED, src
    if (src / "recipe.yaml").is_file() and (src / "checkpoints").is_dir():
        return TRAINED, _latest(src)
    if any(src.glob("iter_*")) or (src / "policy").is_dir():
        raise UsageError(
            str(src),
            "is a NeMo RL (Megatron) checkpoint",
            "convert it to Hugging Face first with NeMo RL's "
            "examples/converters/convert_megatron_to_hf.py, then export that folder",
        )
    raise UsageError(str(src), "no config.json", FIX)
