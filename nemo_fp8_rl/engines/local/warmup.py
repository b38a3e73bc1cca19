"""Supervised warm-up so that GRPO starts from a policy that sometimes succeeds.

Loss: token-mean cross-entropy on the answer and `<eos>` only (`<bos>` and prompt masked),
AdamW (weight decay 0), gradient clipping 1.0, FP32, a fixed number of steps (so the starting
point does not depend on the machine's speed). The result is cached under
`~/.cache/nemo_fp8_rl/warmup/<hash>` (or `$NEMO_FP8_RL_CACHE`), keyed by everything that
determines it, and shared by the BF16 and FP8 recipes of the same model and task.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.engines.local.model import load_untied_state, token_logprobs, untied_state
from nemo_fp8_rl.engines.local.task import sample_problems

CACHE_VERSION = 1


def cache_root() -> Path:
    """Directory of cached warm-ups (`$NEMO_FP8_RL_CACHE/warmup` or `~/.cache/nemo_fp8_rl/warmup`)."""
    base = os.environ.get("NEMO_FP8_RL_CACHE") or Path.home() / ".cache" / "nemo_fp8_rl"
    return Path(base) / "warmup"


def warmup_key(local: LocalConfig, seed: int, vocab: dict[str, int]) -> str:
    """Hash of everything that determines the warm-up result."""
    blob = json.dumps(
        {
            "version": CACHE_VERSION,
            "model": local.model.model_dump(),
            "task": local.task.model_dump(),
            "warmup": local.warmup.model_dump(),
            "seed": seed,
            "vocab": sorted(vocab.items()),
            "torch": torch.__version__.split("+")[0],
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sft_batch(
    tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded `<bos> prompt answer <eos>` rows, attention mask and loss mask `[B, S-1]`."""
    rows, targets = [], []
    for p, a in zip(prompts, answers, strict=True):
        head = [tokenizer.bos_token_id, *tokenizer.convert_tokens_to_ids(list(p))]
        tail = [*tokenizer.convert_tokens_to_ids(list(a)), tokenizer.eos_token_id]
        rows.append(head + tail)
        targets.append(len(tail))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss_mask = torch.zeros(len(rows), width - 1)
    for i, (row, n_tail) in enumerate(zip(rows, targets, strict=True)):
        ids[i, width - len(row) :] = torch.tensor(row)
        attn[i, width - len(row) :] = 1
        loss_mask[i, width - 1 - n_tail :] = 1.0
    return ids, attn, loss_mask


def train_warmup(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, local: LocalConfig, seed: int
) -> list[float]:
    """Run the supervised warm-up in place on `model`; return the per-step losses."""
    cfg = local.warmup
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    losses = []
    model.train()
    for _ in range(cfg.steps):
        problems = sample_problems(local.task, cfg.batch_size, gen)
        ids, attn, loss_mask = _sft_batch(tokenizer, problems.prompts, problems.answers)
        lp, _ = token_logprobs(model, ids, attn)
        loss = -(lp * loss_mask).sum() / loss_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def warm_start(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, local: LocalConfig, seed: int
) -> dict:
    """Load the cached warm-up for this config into `model`, or run and cache it.

    Returns `{"key", "cached", "final_loss", "path"}` for the run's environment record.
    """
    key = warmup_key(local, seed, tokenizer.get_vocab())
    path = cache_root() / key / "model.safetensors"
    if path.exists():
        load_untied_state(model, load_file(path), f"cached warm-up {path} (delete it to rebuild)")
        meta = json.loads((path.parent / "meta.json").read_text())
        return {"key": key, "cached": True, "final_loss": meta["final_loss"], "path": str(path)}
    losses = train_warmup(model, tokenizer, local, seed)
    final = losses[-1] if losses else float("nan")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = untied_state(model)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        save_file(state, Path(tmp) / "model.safetensors")
        (Path(tmp) / "meta.json").write_text(
            json.dumps({"final_loss": final, "steps": len(losses)})
        )
        os.replace(Path(tmp) / "meta.json", path.parent / "meta.json")
        os.replace(Path(tmp) / "model.safetensors", path)
    return {"key": key, "cached": False, "final_loss": final, "path": str(path)}
