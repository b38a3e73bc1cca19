"""NeMo RL's generation config and data layouts in, the shared sampling loop's terms out.

`VllmGenerationWorker.generate` receives right-padded `input_ids` with `input_lengths` and
builds vLLM `SamplingParams` from `policy.generation`; it returns a `GenerationOutputSpec`:

* `output_ids [B, P + G]` (P: padded input length, G: the longest generation): each row holds
  its prompt, then its generated tokens right after the prompt, then `_pad_token_id`;
* `logprobs [B, P + G]` float32: the generated tokens' log-probs at their positions, 0
  elsewhere;
* `generation_lengths`, `unpadded_sequence_lengths` (prompt + generation) int64, `truncated`
  (the row hit its token limit without a stop) bool.

This module maps one onto the other for `nemo_fp8_rl.tiny.sampling`: temperature 0 and
top-k 1 when greedy; `top_k: null` as no top-k; stop at `stop_token_ids` and the model's EOS
(unless `ignore_eos`), at `stop_strings` (config and per sample; the stop string stays in the
output); at most `max_new_tokens`, and never past `vllm_cfg.max_model_len`; log-probs as
`vllm_cfg.logprobs_mode` asks (vLLM's default, `raw_logprobs`, when unset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.tiny.sampling import Generation, SamplingParams, StopFn


class GenerationConfigError(UserError, ValueError):
    """A `policy.generation` setting the CPU generation worker does not implement."""


def sampling_params(cfg: dict[str, Any], greedy: bool) -> SamplingParams:
    """The sampling settings of `policy.generation` (greedy: temperature 0, top-k 1)."""
    if cfg.get("bad_words"):
        raise GenerationConfigError(
            "policy.generation.bad_words",
            "the CPU generation worker does not ban words",
            "set bad_words: null for the CPU loop",
        )
    mode = cfg["vllm_cfg"].get("logprobs_mode") or "raw_logprobs"
    if mode not in ("raw_logprobs", "processed_logprobs"):
        raise GenerationConfigError(
            "policy.generation.vllm_cfg.logprobs_mode",
            f"{mode!r} is not a vLLM mode",
            "use raw_logprobs or processed_logprobs",
        )
    top_k = cfg["top_k"]
    return SamplingParams(
        max_new_tokens=int(cfg["max_new_tokens"]),
        temperature=0.0 if greedy else float(cfg["temperature"]),
        top_p=float(cfg["top_p"]),
        top_k=1 if greedy else (None if top_k in (None, -1) else int(top_k)),
        raw_logprobs=mode == "raw_logprobs",
    )


def stop_token_ids(cfg: dict[str, Any], eos_ids: Sequence[int]) -> list[int]:
    """`stop_token_ids` plus the model's EOS ids (vLLM stops at EOS unless `ignore_eos`)."""
    ids = set(cfg.get("stop_token_ids") or [])
    if not cfg.get("ignore_eos", False):
        ids.update(eos_ids)
    if not ids:
        raise GenerationConfigError(
            "policy.generation.stop_token_ids",
            "no stop token (empty list, no EOS id)",
            "leave stop_token_ids null (NeMo RL sets the tokenizer's EOS)",
        )
    return sorted(ids)


def merged_stop_strings(cfg: dict[str, Any], per_sample: Sequence[Any] | None) -> list[str]:
    """The config's `stop_strings` and every sample's, as one list (NeMo RL merges them)."""
    out = set(cfg.get("stop_strings") or [])
    for strings in per_sample or []:
        out.update(strings or [])
    return sorted(out)


def stop_string_fn(tokenizer: Any, stop_strings: Sequence[str]) -> StopFn | None:
    """A stop hook: a row stops once its decoded generation contains a stop string."""
    if not stop_strings:
        return None
    if tokenizer is None:
        raise GenerationConfigError(
            "policy.generation.stop_strings",
            "the model has no tokenizer to decode with",
            "save the tokenizer next to the checkpoint in model_name",
        )

    def stop(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = []
        for row, valid in zip(tokens.tolist(), mask.bool().tolist(), strict=True):
            text = tokenizer.decode([t for t, v in zip(row, valid, strict=True) if v])
            rows.append(any(s in text for s in stop_strings))
        return torch.tensor(rows, dtype=torch.bool)

    return stop


def left_padded(
    input_ids: torch.Tensor, lengths: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompts as the sampling loop takes them: left-padded ids and their mask."""
    width = int(lengths.max()) if len(lengths) else 0
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        if n:
            ids[i, width - n :] = input_ids[i, :n]
            mask[i, width - n :] = 1
    return ids, mask


def budgets(lengths: torch.Tensor, max_new_tokens: int, max_model_len: int) -> torch.Tensor:
    """Tokens each row may generate: `max_new_tokens`, cut to the model context."""
    longest = int(lengths.max()) if len(lengths) else 0
    if longest >= max_model_len:
        raise GenerationConfigError(
            "error",
            f"policy.generation.vllm_cfg.max_model_len: a prompt of {longest} tokens "
            f"leaves no room to generate within max_model_len={max_model_len}",
            "raise max_model_len or shorten the prompts (data.max_input_seq_length)",
        )
    return torch.clamp(max_model_len - lengths, max=max_new_tokens)


def output_spec(
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    gen: Generation,
    pad_id: int,
    stopped: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """NeMo RL's `GenerationOutputSpec` fields from the sampled rows (module docstring)."""
    gen_lengths = gen.mask.sum(-1).long()
    longest = int(gen_lengths.max()) if len(gen_lengths) else 0
    total = input_ids.shape[1] + longest
    out = torch.full((len(lengths), total), pad_id, dtype=input_ids.dtype)
    logprobs = torch.zeros((len(lengths), total), dtype=torch.float32)
    for i, (n, g) in enumerate(zip(lengths.tolist(), gen_lengths.tolist(), strict=True)):
        out[i, :n] = input_ids[i, :n]
        out[i, n : n + g] = gen.response_ids[i, :g]
        logprobs[i, n : n + g] = gen.logprobs[i, :g].float()
    return {
        "output_ids": out,
        "logprobs": logprobs,
        "generation_lengths": gen_lengths,
        "unpadded_sequence_lengths": lengths.long() + gen_lengths,
        "truncated": ~stopped,
    }


def stopped_rows(gen: Generation, stop_ids: Sequence[int], stop_fn: StopFn | None) -> torch.Tensor:
    """Rows that ended at a stop token or stop string (the others hit their token limit)."""
    g = gen.mask.sum(-1).long()
    last = torch.zeros(len(g), dtype=torch.bool)
    for i, n in enumerate(g.tolist()):
        last[i] = n > 0 and int(gen.response_ids[i, n - 1]) in set(stop_ids)
    if stop_fn is not None and gen.response_ids.shape[1]:
        last = last | stop_fn(gen.response_ids, gen.mask)
    return last


def batch_generator(
    seed: int, input_ids: torch.Tensor, lengths: torch.Tensor, salt: int = 0
) -> torch.Generator:
    """The sampling generator for one `generate` call: seeded by the worker's seed and the
    batch's prompts (SHA-256 of their ids), not by how many calls came before, so a run resumed
    from a checkpoint samples what the uninterrupted run sampled for the same batch. `salt`
    (the async engine's request number) separates one-prompt requests with equal prompts."""
    import hashlib

    digest = hashlib.sha256(str(seed).encode() + (f"/{salt}".encode() if salt else b""))
    for row, n in zip(input_ids.tolist(), lengths.tolist(), strict=True):
        digest.update(repr(row[: int(n)]).encode())
    return torch.Generator().manual_seed(int.from_bytes(digest.digest()[:8], "little"))
