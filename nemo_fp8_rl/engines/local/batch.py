"""The GRPO training batch in NeMo RL's `ClippedPGLossDataDict` layout.

Rows are `<bos> prompt` (left-padded) followed by the response (pad after eos); every per-token
tensor is `[N, S]` with position `j` describing token `j` (prompt positions are 0 / masked), so
the loss slices `[:, 1:]` against next-token log-probs `[N, S-1]`.
"""

from __future__ import annotations

import torch

from nemo_fp8_rl.tiny.sampling import Generation

KEYS = (
    "input_ids",
    "attention_mask",
    "token_mask",
    "sample_mask",
    "advantages",
    "generation_logprobs",
    "reference_policy_logprobs",
)


def build_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen: Generation,
    advantages: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Assemble the training batch from prompts `[N, P]`, responses and sequence advantages `[N]`."""
    n, p = prompt_ids.shape
    zeros = torch.zeros(n, p)
    token_mask = torch.cat([zeros, gen.mask], dim=1)
    return {
        "input_ids": torch.cat([prompt_ids, gen.response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, gen.mask.long()], dim=1),
        "token_mask": token_mask,
        "sample_mask": torch.ones(n),
        "advantages": advantages[:, None].float() * torch.ones_like(token_mask),
        "generation_logprobs": torch.cat([zeros, gen.logprobs], dim=1),
        "reference_policy_logprobs": torch.zeros_like(token_mask),
    }


def select(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """The rows `rows` of every tensor in `batch`."""
    return {k: v[rows] for k, v in batch.items()}


def num_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Prompt + response tokens processed (the attention mask's sum)."""
    return int(batch["attention_mask"].sum())
