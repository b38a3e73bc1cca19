"""Character tokenizer of the embedded engine: one token per character, built offline.

Vocabulary: `<pad>`, `<bos>`, `<eos>`, then the digits, `+-*=<>,:; ` and `a`-`z` (49 tokens).
`<pad>` doubles as the unknown token. Wrapped in `PreTrainedTokenizerFast` so that it saves
and loads like any Hugging Face tokenizer; padding is on the left, as generation needs.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
CHARACTERS = string.digits + "+-*=<>,:; " + string.ascii_lowercase


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (deterministic: same ids on every machine)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
        padding_side="left",
    )


def encode_prompts(
    tokenizer: PreTrainedTokenizerFast, prompts: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode `<bos> + prompt` for each prompt, left-padded to a common length.

    Returns `(input_ids, attention_mask)`, both `[B, P]` int64.
    """
    unknown = sorted({c for p in prompts for c in p if c not in CHARACTERS})
    if unknown:
        raise ValueError(
            f"prompt characters {unknown} are not in the tiny tokenizer's vocabulary; "
            f"use only {CHARACTERS!r}"
        )
    ids = [[tokenizer.bos_token_id, *tokenizer.convert_tokens_to_ids(list(p))] for p in prompts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], dtype=torch.long)
    attention_mask = torch.tensor(
        [[0] * (width - len(x)) + [1] * len(x) for x in ids], dtype=torch.long
    )
    return input_ids, attention_mask


def decode_completions(tokenizer: PreTrainedTokenizerFast, ids: torch.Tensor) -> list[str]:
    """Decode generated ids `[B, T]` to text, stopping at the first `<eos>` or `<pad>`."""
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    out = []
    for row in ids.tolist():
        chars = []
        for tok in row:
            if tok in stop:
                break
            chars.append(tokenizer.convert_ids_to_tokens(tok))
        out.append("".join(chars))
    return out
