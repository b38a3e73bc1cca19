"""Microbatches, forward steps and post-processing for megatron-core's `forward_backward_func`.

The CPU worker's `train` and `get_logprobs` run megatron-core's
`get_forward_backward_func()` (no pipelining at PP = 1) with the forward step below, the
same contract NeMo RL's Megatron worker uses (`nemo_rl/models/megatron/train.py` on 7ea279a,
which cannot be imported here: it needs megatron-bridge):

* inputs per microbatch (unpacked, right-padded): `input_ids`, position ids `0..S-1`, the full
  causal mask (megatron's convention: `True` = masked), as NeMo RL builds them without
  sequence packing;
* training: the loss is NeMo RL's `wrap_loss_fn_with_input_preparation` with its
  `prepare_loss_input`, given the microbatch and the global valid sequence / token counts,
  then divided by the context-parallel size and multiplied back by `num_microbatches / cp`
  (megatron-core divides a 2-tuple loss by the microbatch count), exactly NeMo RL's
  `LossPostProcessor`; logits are temperature-scaled first;
* logprobs: NeMo RL's `from_parallel_logits_to_logprobs` on the (temperature-scaled) logits,
  a zero prepended for the first token, top-k/top-p masking as NeMo RL applies it.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch


def causal_inputs(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids, attention_mask) for right-padded, unpacked sequences."""
    batch, seq = input_ids.shape
    position_ids = torch.arange(seq, dtype=torch.long).unsqueeze(0).expand(batch, seq)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    return position_ids, mask


def temperature_scaled(logits: torch.Tensor, sampling_params: Any) -> torch.Tensor:
    """NeMo RL's `apply_temperature_scaling`: logits / temperature when it is not 1."""
    if sampling_params is not None and sampling_params.temperature != 1.0:
        logits.div_(sampling_params.temperature)
    return logits


def valid_counts(batch: Any, dp_group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Global valid sequences and tokens of a global batch (NeMo RL's `process_global_batch`)."""
    seqs = torch.sum(batch["sample_mask"])
    if "token_mask" in batch:
        toks = torch.sum(batch["token_mask"][:, 1:] * batch["sample_mask"].unsqueeze(-1))
    else:
        toks = seqs * batch["input_ids"].shape[1]
    counts = torch.tensor([float(seqs), float(toks)])
    torch.distributed.all_reduce(counts, group=dp_group)
    return counts[0], counts[1]


def _parallel_groups() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    return {
        "vocab_parallel_rank": ps.get_tensor_model_parallel_rank(),
        "vocab_parallel_group": ps.get_tensor_model_parallel_group(),
        "context_parallel_group": ps.get_context_parallel_group(),
    }


def loss_function(
    loss_fn: Any, mb: Any, cfg: dict, sampling_params: Any, num_mb: int, counts: tuple
) -> Any:
    """`output_tensor -> (loss, metrics)` for one microbatch (NeMo RL's `LossPostProcessor`)."""
    from megatron.core import parallel_state as ps
    from nemo_rl.algorithms.loss import prepare_loss_input, wrap_loss_fn_with_input_preparation

    prepare = partial(
        prepare_loss_input,
        sampling_params=sampling_params,
        chunk_size=cfg.get("logprob_chunk_size"),
    )
    wrapped = partial(
        wrap_loss_fn_with_input_preparation,
        loss_fn=loss_fn,
        prepare_fn=prepare,
        data=mb,
        global_valid_seqs=counts[0],
        global_valid_toks=counts[1],
        **_parallel_groups(),
    )
    cp = ps.get_context_parallel_world_size()

    def post(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict]:
        loss, metrics = wrapped(temperature_scaled(output_tensor, sampling_params))
        return (loss / cp) * num_mb / cp, metrics

    return post


def logprobs_function(mb: Any, cfg: dict, sampling_params: Any) -> Any:
    """`output_tensor -> (0, {"logprobs": [B, S]})` (NeMo RL's `LogprobsPostProcessor`)."""
    from nemo_rl.algorithms.logits_sampling_utils import need_top_k_or_top_p_filtering
    from nemo_rl.algorithms.utils import mask_out_neg_inf_logprobs
    from nemo_rl.distributed.model_utils import from_parallel_logits_to_logprobs

    groups = _parallel_groups()

    def post(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits = temperature_scaled(output_tensor, sampling_params)
        vocab = logits.shape[-1]
        rank = groups["vocab_parallel_rank"]
        lp = from_parallel_logits_to_logprobs(
            logits,
            target=mb["input_ids"],
            vocab_start_index=rank * vocab,
            vocab_end_index=(rank + 1) * vocab,
            tp_group=groups["vocab_parallel_group"],
            inference_only=True,
            chunk_size=cfg.get("logprob_chunk_size"),
            sampling_params=sampling_params,
        )
        lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
        if need_top_k_or_top_p_filtering(sampling_params):
            mask = mb["token_mask"] * mb["sample_mask"].unsqueeze(-1)
            lp = mask_out_neg_inf_logprobs(lp, mask, "prev_logprobs")
        return torch.tensor(0.0), {"logprobs": lp}

    return post


def forward_step(make_post: Any) -> Any:
    """A megatron-core forward step: next microbatch → (logits, its post-processing)."""

    def step(data_iterator: Iterator[Any], model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        mb = next(data_iterator)
        position_ids, mask = causal_inputs(mb["input_ids"])
        logits = model(input_ids=mb["input_ids"], position_ids=position_ids, attention_mask=mask)
        return logits, make_post(mb)

    return step


def run(model: Any, microbatches: list[Any], make_post: Any, forward_only: bool) -> list[dict]:
    """megatron-core's `forward_backward_func` over `microbatches`; the per-microbatch dicts."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    seq = microbatches[0]["input_ids"].shape[1]
    return get_forward_backward_func()(
        forward_step_func=forward_step(make_post),
        data_iterator=iter(microbatches),
        model=model,
        num_microbatches=len(microbatches),
        seq_length=seq,
        micro_batch_size=microbatches[0]["input_ids"].shape[0],
        decoder_seq_length=seq,
        forward_only=forward_only,
    )
