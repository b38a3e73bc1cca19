"""Supervised warm-up so that GRPO starts from a policy that sometimes succeeds.

Loss: token-mean cross-entropy on the answer and `<eos>` only (`<bos>` and prompt masked),
AdamW (weight decay 0), gradient clipping 1.0, FP32. It runs either a fixed number of steps or,
with `local.warmup.target_accuracy: [lo, hi]`, until the greedy exact-match accuracy on a held-out
warm-up set first reaches `lo` (checked every `eval_every` steps; an error if `max_steps` pass or
the accuracy jumps past `hi` between checks). Both stop on a step count, never on time, so the
starting point does not depend on the machine's speed. Its floating-point result does depend on
the machine (CPU kernels, threads), so a shipped warm-up of the same configuration
(`data/warmup/`, `warmup_store`) is used when one exists, on every machine; otherwise the
result is cached per configuration and numerics (`warmup_store.cache_key`) and shared by the
BF16 and FP8 recipes of the same model and task.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from nemo_fp8_rl.config.project import LocalConfig
from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.tiny import warmup_store
from nemo_fp8_rl.tiny.model import load_untied_state, token_logprobs, untied_state
from nemo_fp8_rl.tiny.sampling import SamplingParams, generate
from nemo_fp8_rl.tiny.task import Problems, exact_match_reward, sample_problems
from nemo_fp8_rl.tiny.tokenizer import decode_completions, encode_prompts

WARMUP_EVAL_SEED_OFFSET = 7_777


class WarmupError(UserError, RuntimeError):
    """The warm-up did not end in its target accuracy band: a setting to change (exit 1),
    not a bug."""


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


def warmup_eval_problems(local: LocalConfig) -> Problems:
    """The held-out warm-up check set: `eval_size` problems from `validation_seed + 7777`."""
    gen = torch.Generator().manual_seed(local.task.validation_seed + WARMUP_EVAL_SEED_OFFSET)
    return sample_problems(local.task, local.warmup.eval_size, gen)


@torch.no_grad()
def greedy_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, problems: Problems, digits: int
) -> float:
    """Exact-match accuracy of greedy completions (up to `digits + 2` tokens: answer + eos)."""
    was_training = model.training
    model.eval()
    ids, mask = encode_prompts(tokenizer, problems.prompts)
    gen = generate(
        model,
        ids,
        mask,
        SamplingParams(digits + 2, temperature=0.0),
        torch.Generator().manual_seed(0),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    texts = decode_completions(tokenizer, gen.response_ids)
    model.train(was_training)
    return float(exact_match_reward(texts, problems.answers).mean())


def _band_error(cfg, steps: int, acc: float, why: str) -> WarmupError:
    lo, hi = cfg.target_accuracy
    return WarmupError(
        "local.warmup",
        f"{why} (accuracy {acc:.3f} after {steps} steps, target band [{lo}, {hi}])",
        "raise local.warmup.max_steps or local.warmup.lr to reach it, lower "
        "local.warmup.eval_every to check more often, widen local.warmup.target_accuracy, or "
        "set it to null and use local.warmup.steps",
    )


def train_warmup(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, local: LocalConfig, seed: int
) -> dict:
    """Run the supervised warm-up in place on `model`.

    Returns `{"losses", "steps", "accuracy", "checks"}`: per-step losses, steps taken, the
    held-out greedy accuracy at the end (None for a fixed count) and the `(step, accuracy)`
    checks. Raises `WarmupError` when a target band is set and not reached.
    """
    cfg = local.warmup
    band = cfg.target_accuracy
    limit = cfg.max_steps if band is not None else cfg.steps
    held_out = warmup_eval_problems(local) if band is not None else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    losses: list[float] = []
    checks: list[list] = []
    model.train()
    for step in range(1, limit + 1):
        problems = sample_problems(local.task, cfg.batch_size, gen)
        ids, attn, loss_mask = _sft_batch(tokenizer, problems.prompts, problems.answers)
        lp, _ = token_logprobs(model, ids, attn)
        loss = -(lp * loss_mask).sum() / loss_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if band is not None and (step % cfg.eval_every == 0 or step == limit):
            acc = greedy_accuracy(model, tokenizer, held_out, local.task.digits)
            checks.append([step, acc])
            if acc > band[1]:
                raise _band_error(cfg, step, acc, "the accuracy jumped past the band")
            if acc >= band[0]:
                break
    model.eval()
    if band is not None and (not checks or checks[-1][1] < band[0]):
        acc = checks[-1][1] if checks else float("nan")
        raise _band_error(cfg, len(losses), acc, "max_steps passed below the band")
    accuracy = checks[-1][1] if checks else None
    return {"losses": losses, "steps": len(losses), "accuracy": accuracy, "checks": checks}


def warm_start(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, local: LocalConfig, seed: int
) -> dict:
    """Load the shipped or cached warm-up for this config into `model`, or run and cache it.

    Returns `{"key", "cached", "source", "final_loss", "steps", "accuracy", "checks", "path"}`
    for the run's environment record (`source`: shipped, cache or computed; `accuracy`: the
    held-out greedy accuracy that ended a band warm-up).
    """
    folder, source = warmup_store.lookup(local, seed, tokenizer.get_vocab())
    path = folder / "model.safetensors"
    if path.exists():
        load_untied_state(model, load_file(path), f"warm-up {path} (delete it to rebuild)")
        meta = json.loads((folder / "meta.json").read_text())
        return {"key": folder.name, "cached": True, "source": source, **_summary(meta),
                "path": str(path)}  # fmt: skip
    result = train_warmup(model, tokenizer, local, seed)
    losses = result["losses"]
    meta = {
        "final_loss": losses[-1] if losses else float("nan"),
        "steps": result["steps"],
        "accuracy": result["accuracy"],
        "checks": result["checks"],
        "built_with": warmup_store.numerics(),
    }
    warmup_store.save(folder, untied_state(model), meta)
    return {"key": folder.name, "cached": False, "source": "computed", **_summary(meta),
            "path": str(path)}  # fmt: skip


def _summary(meta: dict) -> dict:
    """The fields of a warm-up's meta.json that go to the run's environment record."""
    return {k: meta.get(k) for k in ("final_loss", "steps", "accuracy", "checks")}
