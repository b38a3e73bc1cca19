"""BF16 shadow log-probs on a GPU: unlike FP8's, and equal to a pure-BF16 forward (TE, CUDA).

A tiny megatron-core GPTModel with Transformer Engine layers, BF16 weights and FP8 compute
(`fp8: hybrid`, the recipe as parametrised) runs three forwards on the same tokens: FP8, with
`Fp8ComputeSwitch` off (the shadow pass), FP8 again. A second model built with `fp8: None` and
the same weights gives the pure-BF16 reference. Checked: prob_nmae(FP8, shadow) > 0 (FP8 really
ran, and the switch really left it), max |shadow − BF16| ≤ 1e-3 on the token log-probs, and
the FP8 forward after the switch equals the one before it (1e-3). Run by scripts/gpu_check.sh;
skipped without CUDA, Transformer Engine or megatron-core.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from nemo_fp8_rl.calibration.diagnostics import prob_nmae
from nemo_fp8_rl.engines.nemo.worker.fp8_switch import Fp8ComputeSwitch


def _missing() -> str | None:
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU (run by scripts/gpu_check.sh)"
    for module, what in (
        ("transformer_engine.pytorch", "Transformer Engine"),
        ("megatron.core", "megatron-core"),
    ):
        try:
            __import__(module)
        except Exception as exc:  # TE can fail with OSError/RuntimeError on a bad CUDA setup
            return f"{what} is not importable here ({type(exc).__name__}: {exc})"
    return None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]

SEQ, BATCH, VOCAB = 128, 2, 512


@pytest.fixture(scope="module")
def megatron_gpu():
    """Single-process NCCL group and model-parallel state of size 1 on GPU 0."""
    from megatron.core import parallel_state, tensor_parallel

    torch.cuda.set_device(0)
    owns = not torch.distributed.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        if owns:
            torch.distributed.init_process_group(
                "nccl", init_method=f"file://{os.path.join(tmp, 'pg')}", world_size=1, rank=0
            )
        parallel_state.initialize_model_parallel(1, 1)
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            if owns:
                torch.distributed.destroy_process_group()


def _build(fp8: str | None, recipe: str) -> torch.nn.Module:
    """GPTModel, TE layer spec, BF16 parameters; FP8 compute when `fp8` is set."""
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=512,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        init_method_std=0.05,
        fp8=fp8,
        fp8_recipe=recipe,
    )
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    return model.cuda().eval()


def _token_logprobs(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token_t | tokens_<t) [batch, seq-1] in FP32 (causal attention from the TE spec)."""
    position_ids = torch.arange(SEQ, device=tokens.device).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        logits = model(tokens, position_ids, None).float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    return logprobs.gather(-1, tokens[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("recipe", ["blockwise", "tensorwise"])
def test_shadow_pass_is_bf16_and_differs_from_fp8(megatron_gpu, recipe: str) -> None:
    tokens = torch.randint(
        0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)
    ).cuda()
    model = _build("hybrid", recipe)
    reference = _build(None, recipe)
    weights = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = reference.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)

    switch = Fp8ComputeSwitch()
    fp8 = _token_logprobs(model, tokens)
    assert switch.set(model, enabled=False) >= 1
    shadow = _token_logprobs(model, tokens)
    switch.set(model, enabled=True)
    fp8_again = _token_logprobs(model, tokens)
    bf16 = _token_logprobs(reference, tokens)

    mask = torch.ones_like(fp8)
    nmae = prob_nmae(fp8, shadow, mask)
    gap = (shadow - bf16).abs().max().item()
    print(
        f"fp8 switch [{recipe}]: prob_nmae(FP8, shadow) = {nmae:.3e}; "
        f"max |shadow - BF16| = {gap:.3e}; max |FP8 after - FP8 before| = "
        f"{(fp8_again - fp8).abs().max().item():.3e}"
    )
    assert nmae > 0
    assert gap <= 1e-3
    torch.testing.assert_close(fp8_again, fp8, atol=1e-3, rtol=0)
