"""Autoregressive sampling with a KV cache, returning generation log-probs as vLLM does.

Shared by both engines' CPU generation (the embedded engine's rollout and the NeMo RL loop's
CPU generation worker); it depends on torch and transformers only.

The returned log-prob of each sampled token is taken from the processed distribution the
token was drawn from (vLLM's `logprobs_mode: processed_logprobs`): logits divided by the
temperature, then top-k / top-p filtered. With the default `top_k: null, top_p: 1.0` this is
`log softmax(z / T)`, the same distribution the trainer scores. `raw_logprobs=True` returns
vLLM's `raw_logprobs` instead: `log softmax(z)` of the model's logits, before any processing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

StopFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingParams:
    """NeMo RL's `policy.generation` sampling keys (temperature 0 means greedy)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    raw_logprobs: bool = False


@dataclass
class Generation:
    """Sampled responses: ids `[B, T]` (pad after the stop), log-probs `[B, T]`, mask `[B, T]`.

    The mask covers the generated tokens up to and including the one that stopped the row.
    """

    response_ids: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: `cumsum(mask) - 1`, clamped at 0 on padding."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def _filter_logits(z: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf."""
    if top_k is not None and 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix reaching top_p
        sorted_z = sorted_z.masked_fill(drop, float("-inf"))
        z = torch.full_like(z, float("-inf")).scatter(-1, order, sorted_z)
    return z


def _next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return `(token, its log-prob)` (module docstring)."""
    if params.temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
    else:
        z = _filter_logits(logits / params.temperature, params.top_k, params.top_p)
        logp = torch.log_softmax(z, dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        if params.raw_logprobs:
            logp = torch.log_softmax(logits, dim=-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _stop_ids(eos_id: int | Collection[int]) -> torch.Tensor:
    ids = [eos_id] if isinstance(eos_id, int) else sorted(set(eos_id))
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    eos_id: int | Collection[int],
    pad_id: int,
    *,
    budgets: torch.Tensor | None = None,
    stop_fn: StopFn | None = None,
) -> Generation:
    """Sample up to `max_new_tokens` per left-padded prompt, stopping a row at a token of
    `eos_id` (one id or several), after `budgets[row]` tokens when given, or when
    `stop_fn(response_ids [B, t], mask [B, t])` says so for the row (stop strings)."""
    batch = input_ids.shape[0]
    stop_ids = _stop_ids(eos_id)
    cache = DynamicCache()
    mask = attention_mask.clone()
    pos = position_ids(mask)
    step_ids = input_ids
    done = torch.zeros(batch, dtype=torch.bool)
    if budgets is not None:
        done = done | (budgets <= 0)
    tokens, logprobs, valid = [], [], []
    for step in range(params.max_new_tokens):
        if bool(done.all()):
            break
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
        )
        tok, lp = _next_token(out.logits[:, -1].float(), params, generator)
        valid.append(~done)
        tokens.append(torch.where(done, pad_id, tok))
        logprobs.append(torch.where(done, 0.0, lp))
        done = done | torch.isin(tok, stop_ids)
        if budgets is not None:
            done = done | (budgets <= step + 1)
        if stop_fn is not None:
            done = done | stop_fn(torch.stack(tokens, 1), torch.stack(valid, 1))
        step_ids = tokens[-1][:, None]
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
        pos = pos[:, -1:] + 1
    if not tokens:
        empty = torch.zeros(batch, 0)
        return Generation(empty.long(), empty, empty)
    return Generation(
        response_ids=torch.stack(tokens, 1),
        logprobs=torch.stack(logprobs, 1),
        mask=torch.stack(valid, 1).float(),
    )
