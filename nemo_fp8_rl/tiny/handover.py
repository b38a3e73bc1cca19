"""The embedded default's model and task, handed to NeMo RL's loop on CPU as NeMo RL reads them.

`--engine nemo` on a CPU recipe runs NeMo RL's own `grpo.setup`/`grpo_train` (`engines.nemo.cpu`).
NeMo RL loads a Hugging Face checkpoint folder and a `ResponseDataset` (JSONL); this module
writes both from the embedded engine's parts, so the two engines start from the same place:

* `<run dir>/nemo-inputs/model`: the tiny model after the embedded engine's warm-up (the same
  shipped or cached warm-up the local recipes use), saved with its tokenizer and a chat
  template that renders a prompt as `<bos>` + the user's text, exactly the embedded engine's
  prompt encoding, so NeMo RL's `math_hf_data_processor` tokenizes the same ids;
* `<run dir>/nemo-inputs/{train,validation}.jsonl`: addition problems `{"input": "a+b=",
  "output": "<sum>"}`; NeMo RL's math environment scores an answer with math-verify, which
  reads the plain number the tiny model writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from nemo_fp8_rl.config.safe_files import write_atomic
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.tiny import INPUTS

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _write_jsonl(path: Path, prompts: list[str], answers: list[str]) -> None:
    """One `{"input", "output"}` object per line (NeMo RL `ResponseDataset`'s default keys)."""
    lines = [json.dumps({"input": p, "output": a}) for p, a in zip(prompts, answers, strict=True)]
    write_atomic(path, "\n".join(lines) + "\n")


def _train_problems(local: Any, count: int) -> tuple[list[str], list[str]]:
    """`count` training problems drawn from the task's train seed (distinct from validation)."""
    from nemo_fp8_rl.tiny.task import sample_problems

    gen = torch.Generator().manual_seed(local.task.train_seed * 1_000_003)
    problems = sample_problems(local.task, count, gen)
    return problems.prompts, problems.answers


def train_prompts(grpo: dict[str, Any]) -> int:
    """Training prompts the run draws: one batch per step; asynchronous GRPO's collector also
    generates ahead and drops groups older than `max_trajectory_age_steps`, and it stops the
    run when its dataloader is exhausted (it does not start another epoch), so it gets
    NeMo RL's buffer slack (2 x the age) in batches on top."""
    steps = grpo["max_num_steps"]
    async_grpo = grpo.get("async_grpo") or {}
    if async_grpo.get("enabled"):
        steps += 2 * int(async_grpo.get("max_trajectory_age_steps", 1))
    return grpo["num_prompts_per_step"] * steps


class ResumeDataError(UserError):
    """A resume would train on another prompt file than the run's checkpoints were made with."""


def _lines(path: Path) -> int | None:
    """Lines of a JSONL file (None when it does not exist)."""
    return len(path.read_text().splitlines()) if path.exists() else None


def check_resume_data(train: Path, count: int, grpo: dict[str, Any]) -> None:
    """Refuse a resume whose training prompt file would change size: NeMo RL restores the
    dataloader's position from the checkpoint, and over a file of another size that position
    names other prompts (the file is drawn from one seed, so its size alone changes it)."""
    held = _lines(train)
    if held is None or held == count:
        return
    per_step = grpo["num_prompts_per_step"]
    raise ResumeDataError(
        f"{train} (grpo.max_num_steps)",
        f"the run was started with {held} training prompts ({held // per_step} steps of "
        f"{per_step}); resuming with grpo.max_num_steps={grpo['max_num_steps']} would rewrite it "
        f"with {count}, and the checkpoint's dataloader position would then point into "
        "other prompts",
        f"resume with the settings the run started with (grpo.max_num_steps="
        f"{held // per_step} or the override you gave then), or start a new run with "
        "--run-dir or --overwrite",
    )


def prepare(cfg: dict[str, Any], run_dir: Path, resume: bool = False) -> dict[str, str]:
    """Write the warm-started model and the data files; returns their paths (`model`, `train`,
    `validation`) and the warm-up's source (`warmup`: shipped, cache or computed). A `resume`
    whose training prompt file would change size is refused first (`check_resume_data`).
    `cfg` is the resolved recipe's config (its `local` and `grpo` sections are read)."""
    from nemo_fp8_rl.config.project import LocalConfig
    from nemo_fp8_rl.tiny.model import build_model, quiet_transformers, save_checkpoint
    from nemo_fp8_rl.tiny.task import validation_problems
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer
    from nemo_fp8_rl.tiny.warmup import warm_start

    quiet_transformers()
    local = LocalConfig(**cfg["local"])
    seed = cfg["grpo"]["seed"]
    folder = run_dir / INPUTS
    count = max(train_prompts(cfg["grpo"]), 64)
    if resume:
        check_resume_data(folder / "train.jsonl", count, cfg["grpo"])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model = build_model(local.model, tokenizer, seed)
    warm = warm_start(model, tokenizer, local, seed)
    model_dir = folder / "model"
    save_checkpoint(model, tokenizer, model_dir)
    train = folder / "train.jsonl"
    _write_jsonl(train, *_train_problems(local, count))
    val = validation_problems(local.task)
    validation = folder / "validation.jsonl"
    _write_jsonl(validation, val.prompts, val.answers)
    return {
        "model": str(model_dir),
        "train": str(train),
        "validation": str(validation),
        "warmup": str(warm["source"]),
    }
