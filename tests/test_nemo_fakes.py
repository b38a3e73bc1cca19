"""CPU stand-ins for what cannot exist on this machine: NeMo RL's GPU policy workers.

`FakeNemoPolicy` plays NeMo RL's `Policy` (Megatron workers behind Ray) for the engine's
driver-side logic: same `get_logprobs` / `train` / `save_checkpoint` calls and result layout,
same sharding of global batches over data-parallel ranks, same per-micro-batch metric rule
(divided by the number of global batches), the loss pickled per call as Ray does, FP8 compute
emulated with the project's `fake_quantize`. The model is a bigram table, small enough for
exact checks. The batch type is NeMo RL's `BatchedDataDict` when importable, else a dict with
its `slice` method. This module holds no tests.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from nemo_fp8_rl.fp8 import FP8Spec, fake_quantize

try:
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict as Batch
except ImportError:

    class Batch(dict):  # type: ignore[no-redef]
        """Stand-in for NeMo RL's BatchedDataDict: a dict of [B, ...] tensors with `slice`."""

        def slice(self, start: int, end: int) -> Batch:
            return Batch({k: v[start:end] for k, v in self.items()})


VOCAB, HIDDEN = 24, 16
_SPEC = FP8Spec.preset("tensorwise")


class FakeNemoPolicy:
    """NeMo RL `Policy` stand-in (see module docstring); `dp` data-parallel ranks, SGD updates."""

    def __init__(self, seed: int = 0, dp: int = 1, lr: float = 2.0, mbs: int = 4) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(VOCAB, HIDDEN, generator=gen).requires_grad_()
        self.out = (torch.randn(HIDDEN, VOCAB, generator=gen) * 0.7).requires_grad_()
        self.dp, self.lr, self.mbs = dp, lr, mbs
        self.fp8_on = True
        self.schedule_ticks, self.schedule_held = 0, False  # NeMo RL: one tick per train() call
        self.calls: list[tuple[str, bool, int]] = []  # (method, fp8_on, rows)
        self.train_sizes: list[int] = []
        self.saved: list[str] = []

    # the two worker controls the engine drives
    def switch(self, enabled: bool) -> None:
        self.fp8_on = enabled

    def hold_schedule(self, held: bool) -> None:
        self.schedule_held = held

    def _logprobs_all(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, S-1] log-prob of token t+1 given token t (FP8-emulated weights when on)."""
        emb, out = self.emb, self.out
        if self.fp8_on:
            emb, out = fake_quantize(emb, _SPEC), fake_quantize(out, _SPEC)
        logits = emb[input_ids[:, :-1]] @ out
        logp = torch.log_softmax(logits.float(), dim=-1)
        return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    def get_logprobs(self, data: Any, timer: Any = None) -> dict[str, torch.Tensor]:
        self.calls.append(("get_logprobs", self.fp8_on, int(data["input_ids"].shape[0])))
        with torch.no_grad():
            lp = self._logprobs_all(data["input_ids"])
        return {"logprobs": torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)}

    def _rank_rows(self, lo: int, hi: int) -> list[tuple[int, int]]:
        share = (hi - lo) // self.dp
        return [(lo + r * share, lo + (r + 1) * share) for r in range(self.dp)]

    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
    ) -> dict[str, Any]:
        self.calls.append(("train", eval_mode, int(data["input_ids"].shape[0])))
        if not eval_mode:
            self.train_sizes.append(int(data["input_ids"].shape[0]))
        gbs = gbs or 8
        n_rows = data["input_ids"].shape[0]
        num_gb = n_rows // gbs
        per_rank: list[list[dict]] = [[] for _ in range(self.dp)]
        losses, grad_norm = [], torch.tensor(0.0)
        for g in range(num_gb):
            chunk = data.slice(g * gbs, (g + 1) * gbs)
            mask = chunk["token_mask"][:, 1:] * chunk["sample_mask"].unsqueeze(-1)
            gt, gs = mask.sum(), chunk["sample_mask"].sum()
            total = 0.0
            for r, (lo, hi) in enumerate(self._rank_rows(g * gbs, (g + 1) * gbs)):
                worker_loss = pickle.loads(pickle.dumps(loss_fn))  # Ray ships a copy per call
                for s in range(lo, hi, mbs or self.mbs):
                    mb = data.slice(s, min(s + (mbs or self.mbs), hi))
                    lp = self._logprobs_all(mb["input_ids"])
                    loss, metrics = worker_loss(
                        next_token_logprobs=lp, data=mb, global_valid_seqs=gs, global_valid_toks=gt
                    )
                    if not eval_mode:
                        loss.backward()
                    total += float(loss.detach())
                    per_rank[r].append(
                        {
                            k: (v if ("_min" in k or "_max" in k) else v / num_gb)
                            for k, v in metrics.items()
                        }
                    )
            losses.append(total)
            if not eval_mode:
                grad_norm = self._step()
        if not eval_mode and not self.schedule_held:
            self.schedule_ticks += 1
        merged: dict[str, list] = {}
        for rank_metrics in per_rank:  # Policy.train extends the lists rank after rank
            for m in rank_metrics:
                for k, v in m.items():
                    merged.setdefault(k, []).append(v)
        return {
            "loss": torch.tensor(losses),
            "grad_norm": torch.tensor([float(grad_norm)]),
            "all_mb_metrics": merged,
        }

    def _step(self) -> torch.Tensor:
        lr = self.lr * (1.0 + 0.5 * self.schedule_ticks)  # a schedule that moves every tick
        with torch.no_grad():
            norm = torch.sqrt(sum((p.grad**2).sum() for p in (self.emb, self.out)))
            for p in (self.emb, self.out):
                p -= lr * p.grad
                p.grad = None
        return norm

    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.saved.append(weights_path)

    def offload_after_refit(self) -> str:  # any other Policy method: passed through untouched
        return "offloaded"


def make_batch(
    policy: FakeNemoPolicy, rows: int = 32, seq: int = 10, prompt: int = 3, seed: int = 1
) -> Any:
    """A rollout batch as `grpo_train` hands it to `policy.train` (prev log-probs from FP8)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, seq), generator=gen)
    token_mask = torch.zeros(rows, seq)
    token_mask[:, prompt:] = 1.0
    lengths = torch.randint(seq - 3, seq + 1, (rows,), generator=gen)
    for i, n in enumerate(lengths.tolist()):
        token_mask[i, n:] = 0.0
    adv = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0) * (
        0.5 + torch.rand(rows, generator=gen)
    )
    batch = Batch(
        {
            "input_ids": input_ids,
            "input_lengths": lengths,
            "token_mask": token_mask,
            "sample_mask": torch.ones(rows),
            "advantages": adv.unsqueeze(1).expand(rows, seq).clone(),
        }
    )
    prev = policy.get_logprobs(batch)["logprobs"]
    policy.calls.clear()
    batch["prev_logprobs"] = prev
    batch["generation_logprobs"] = prev + 0.02 * torch.randn(rows, seq, generator=gen)
    batch["reference_policy_logprobs"] = prev.clone()
    return batch
