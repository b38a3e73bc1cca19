"""The embedded engine's tiny causal LM: a real transformers Qwen3 or Llama model.

The architecture comes from the recipe's `local.model` section; the vocabulary and special
token ids from the character tokenizer. Weights are initialised from the recipe seed, so the
same recipe builds the same model on every machine.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from nemo_fp8_rl.config.project import TinyModelConfig
from nemo_fp8_rl.config.safe_files import write_folder
from nemo_fp8_rl.tiny.sampling import position_ids


def quiet_transformers() -> None:
    """Turn off transformers' per-file progress bars (loading and saving the tiny model)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def hf_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast):
    """The transformers config of the tiny model (Qwen3Config or LlamaConfig)."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    if cfg.arch == "qwen3":
        return Qwen3Config(head_dim=cfg.hidden_size // cfg.num_attention_heads, **common)
    return LlamaConfig(**common)


def build_model(
    cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int
) -> PreTrainedModel:
    """Build the tiny model in FP32 with weights drawn from `seed` (eval mode, no dropout)."""
    config = hf_config(cfg, tokenizer)
    cls = Qwen3ForCausalLM if cfg.arch == "qwen3" else LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.to(torch.float32).eval()


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save `model` and `tokenizer` as a Hugging Face checkpoint (safetensors) in `path`, built
    beside it and swapped in whole (`safe_files.write_folder`: never through a link, a full
    disk a located error that leaves what was there)."""

    def build(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)  # safe-write: private
        tokenizer.save_pretrained(tmp)  # safe-write: private

    write_folder(Path(path), build, "model")


def untied_state(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """State dict without tensors that share storage with an earlier one (tied lm_head)."""
    seen, state = set(), {}
    for k, v in model.state_dict().items():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            state[k] = v.detach().contiguous()
    return state


def load_untied_state(model: PreTrainedModel, state: dict[str, torch.Tensor], where: str) -> None:
    """Load a state dict saved without the tied LM head, refusing anything else missing."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if k == "lm_head.weight" and model.config.tie_word_embeddings}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"{where} does not match the model: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )


def policy_from_config(
    config: dict, model_dir: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The policy model and tokenizer: loaded from `model_dir`, or (None) built from the
    recipe's `local.model` and `grpo.seed`, for actors that receive their weights later."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_fp8_rl.config.project import LocalConfig
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer

    if model_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(model_dir)
    tokenizer = build_tokenizer()
    local = LocalConfig(**config["local"])
    return build_model(local.model, tokenizer, config["grpo"]["seed"]), tokenizer


def load_weights(model: PreTrainedModel, model_dir: str) -> None:
    """Copy the weights of the HF checkpoint in `model_dir` into `model`, in place."""
    from safetensors.torch import load_file

    path = Path(model_dir) / "model.safetensors"
    with torch.no_grad():
        load_untied_state(model, load_file(path), str(path))


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next-token log-probs `[B, S-1]`: `lp[:, t] = log softmax(z_t / T)[input_ids[:, t+1]]`.

    With `with_entropy`, also the per-position entropy `H_t = -sum_v p_v log p_v` (detached).
    """
    logits = (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        )
        .logits[:, :-1]
        .float()
    )
    logp = torch.log_softmax(logits / temperature, dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy
