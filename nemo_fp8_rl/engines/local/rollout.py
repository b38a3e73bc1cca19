"""The rollout engine: a fake-quantized copy of the policy fed through the refit bridge.

It plays vLLM's part: it holds the generation-side model (W8A8 FP8 emulation per
`policy.generation.vllm_cfg`, FP8 KV cache emulation when `kv_cache_dtype: fp8`), receives the
trainer's weights as refit buckets (verified before they touch the model), samples responses
with their generation log-probs, and scores the validation split.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_fp8_rl.config.project import TaskConfig
from nemo_fp8_rl.engines.local import bf16_scoring, precision
from nemo_fp8_rl.refit import ModuleReceiver
from nemo_fp8_rl.tiny.model import policy_from_config, quiet_transformers
from nemo_fp8_rl.tiny.sampling import Generation, SamplingParams, generate
from nemo_fp8_rl.tiny.task import exact_match_reward, validation_problems
from nemo_fp8_rl.tiny.tokenizer import decode_completions, encode_prompts


class Rollout:
    """Generation engine (a Ray actor in the embedded engine; a plain object in tests)."""

    def __init__(
        self, config: dict[str, Any], model_dir: str | None = None, num_threads: int = 1
    ) -> None:
        """Set up the generation model (from `model_dir`, or built from the recipe: its weights
        arrive with the first refit anyway) with the rollout precision of the recipe."""
        torch.set_num_threads(num_threads)
        quiet_transformers()
        gen = config["policy"]["generation"]
        self.model, self.tokenizer = policy_from_config(config, model_dir)
        self.precision = precision.RolloutPrecision.from_config(config, self.model)
        self.precision.apply(self.model)
        self.receiver = ModuleReceiver(self.model)
        self.params = SamplingParams(
            max_new_tokens=gen["max_new_tokens"],
            temperature=gen["temperature"],
            top_p=gen["top_p"],
            top_k=gen["top_k"],
        )
        self.val_params = SamplingParams(
            max_new_tokens=gen["max_new_tokens"],
            temperature=gen.get("val_temperature", gen["temperature"]),
            top_p=gen.get("val_top_p", gen["top_p"]),
            top_k=gen.get("val_top_k", gen["top_k"]),
        )
        self.task = TaskConfig(**config["local"]["task"])
        self.config, self.num_threads = config, num_threads
        self._bf16_twin: Rollout | None = None

    def apply_refit(self, refit: tuple[list, list[tuple[float, float]]]) -> int:
        """Load `(buckets, kv_scales)` from the trainer; returns the number of tensors applied.

        The buckets are verified before any weight changes (a bad refit raises `RefitError`
        and leaves the engine as it was); K/V scales go to the FP8 KV cache when it is on.
        """
        buckets, scales = refit
        applied = self.receiver.apply(buckets)
        if self.precision.kv_fp8:
            precision.set_kv_scales(self.model, scales)
        return applied

    def served_precision(self) -> dict[str, Any]:
        """Each decoder linear layer's served precision (`engines.local.served`), as a dict."""
        from nemo_fp8_rl.engines.local.served import served_counts

        return served_counts(self.model).to_dict()

    def generate(
        self, prompts: list[str], seed: int
    ) -> tuple[torch.Tensor, torch.Tensor, Generation, list[str]]:
        """Sample one response per prompt with a generator seeded by `seed`.

        Returns `(prompt_ids, prompt_mask, generation, completions)`.
        """
        ids, mask = encode_prompts(self.tokenizer, prompts)
        gen = generate(
            self.model,
            ids,
            mask,
            self.params,
            torch.Generator().manual_seed(seed),
            self.tokenizer.eos_token_id,
            self.tokenizer.pad_token_id,
        )
        return ids, mask, gen, decode_completions(self.tokenizer, gen.response_ids)

    def validate(self, seed: int) -> dict[str, float]:
        """Exact-match accuracy on the validation split: greedy and sampled (val_* settings)."""
        problems = validation_problems(self.task)
        ids, mask = encode_prompts(self.tokenizer, problems.prompts)
        out = {}
        greedy = SamplingParams(self.params.max_new_tokens, temperature=0.0)
        for name, params in (("accuracy", greedy), ("accuracy_sampled", self.val_params)):
            gen = generate(
                self.model,
                ids,
                mask,
                params,
                torch.Generator().manual_seed(seed),
                self.tokenizer.eos_token_id,
                self.tokenizer.pad_token_id,
            )
            texts = decode_completions(self.tokenizer, gen.response_ids)
            out[f"validation/{name}"] = float(exact_match_reward(texts, problems.answers).mean())
        return out

    def validate_bf16(
        self, refit: tuple[list, list[tuple[float, float]]], seed: int
    ) -> dict[str, float]:
        """The validation scores of the weights in `refit` (a BF16 refit) generated in BF16.

        A BF16 twin of this engine (built on first use) receives the refit and scores the split
        exactly as `validate` does; see `bf16_scoring` for why.
        """
        if self._bf16_twin is None:
            config = bf16_scoring.bf16_generation_config(self.config)
            self._bf16_twin = Rollout(config, None, self.num_threads)
        self._bf16_twin.apply_refit(refit)
        return bf16_scoring.as_bf16_scores(self._bf16_twin.validate(seed))

    def ping(self) -> bool:
        """Liveness check for the driver (returns once the engine is constructed)."""
        return True
