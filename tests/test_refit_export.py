"""FP8 checkpoint export and the `nemo_fp8_rl.refit export` command, checked at the format level
and by loading the block-FP8 checkpoint back with transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.cli.refit import main
from nemo_fp8_rl.fp8 import FP8Spec, dequantize, fake_quantize


def _save_tiny(path: Path, hidden: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    return out


def test_block_export_format(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    original = _save_tiny(tmp_path / "src")
    assert (
        main(
            [
                "export",
                str(tmp_path / "src"),
                str(tmp_path / "out"),
                "--last-bf16",
                "1",
                "--shard-size-mb",
                "1",
            ]
        )
        == 0
    )
    out = tmp_path / "out"
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization_config"]
    assert quant["quant_method"] == "fp8" and quant["activation_scheme"] == "dynamic"
    assert quant["weight_block_size"] == [128, 128]
    assert "model.layers.2.mlp.down_proj" in quant["ignored_layers"]
    assert "model.layers.0.mlp.down_proj" not in quant["ignored_layers"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {s.name for s in shards}
    tensors = _tensors(out)
    assert set(index["weight_map"]) == set(tensors)
    spec = FP8Spec.preset("blockwise")
    for name, w in original.items():
        got = tensors[name]
        if name.startswith("model.layers.2.") or not name.endswith("_proj.weight"):
            assert got.dtype == torch.bfloat16 and torch.equal(got, w), name
            continue
        scale = tensors[name + "_scale_inv"]
        assert got.dtype == torch.float8_e4m3fn and got.shape == w.shape
        assert scale.dtype == torch.float32
        assert tuple(scale.shape) == (math.ceil(w.shape[0] / 128), math.ceil(w.shape[1] / 128))
        assert torch.equal(dequantize(got, scale, spec), fake_quantize(w.float(), spec)), name


def test_transformers_loads_block_fp8_export(tmp_path: Path) -> None:
    pytest.importorskip(
        "accelerate", reason="transformers needs accelerate to load FP8 checkpoints"
    )
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    original = _save_tiny(tmp_path / "src", seed=3)
    assert main(["export", str(tmp_path / "src"), str(tmp_path / "out"), "--pow2"]) == 0
    # No GPU here: transformers dequantizes the FP8 checkpoint to BF16 while loading.
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    loaded = dict(model.named_parameters())
    spec = FP8Spec.preset("blockwise_pow2")
    name = "model.layers.1.self_attn.k_proj.weight"
    want = fake_quantize(original[name].float(), spec)
    # Power-of-2 scales make q × scale exact in BF16, so the loaded weight is bit-exact.
    assert torch.equal(loaded[name].float(), want)
    assert not torch.equal(loaded[name], original[name]), "FP8 rounding must show in the weights"
    assert torch.equal(loaded["model.norm.weight"], original["model.norm.weight"])


def test_channel_and_misaligned_exports(tmp_path: Path) -> None:
    _save_tiny(tmp_path / "src", hidden=128)  # k/v rows = 64: off vLLM's 128-row block grid
    assert main(["export", str(tmp_path / "src"), str(tmp_path / "blk")]) == 0
    quant = json.loads((tmp_path / "blk" / "config.json").read_text())["quantization_config"]
    assert {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"} <= set(
        quant["ignored_layers"]
    )
    assert (
        _tensors(tmp_path / "blk")["model.layers.0.self_attn.k_proj.weight"].dtype == torch.bfloat16
    )

    assert main(["export", str(tmp_path / "src"), str(tmp_path / "ch"), "--scheme", "channel"]) == 0
    config = json.loads((tmp_path / "ch" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    tensors = _tensors(tmp_path / "ch")
    assert tensors["model.layers.0.self_attn.k_proj.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.self_attn.k_proj.weight_scale"].shape == (64, 1)


def test_export_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert invoke(main, ["export", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_export_takes_the_scheme_from_a_recipe(tmp_path: Path) -> None:
    _save_tiny(tmp_path / "src")
    recipe = "llama3.1-8b-instruct/grpo-llama3.1-8b-instruct-1n8g-fp8"  # use_deep_gemm: true
    args = ["export", str(tmp_path / "src"), str(tmp_path / "out"), "--recipe", recipe]
    assert main([*args, "policy.generation.vllm_cfg.num_first_layers_in_bf16=1"]) == 0
    tensors = _tensors(tmp_path / "out")
    scale = tensors["model.layers.1.mlp.up_proj.weight_scale_inv"]
    assert torch.equal(scale, torch.exp2(torch.log2(scale).round())), "scales must be powers of 2"
    assert tensors["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16


def test_receiver_reads_an_exported_fp8_checkpoint(tmp_path: Path) -> None:
    """The engine side reads its served FP8 checkpoint's shapes (weights and scales); the
    export side refuses the same folder as a BF16 source."""
    from nemo_fp8_rl.refit.export import checkpoint_shapes
    from nemo_fp8_rl.refit.safe_output import ExportError
    from nemo_fp8_rl.refit.vllm_receiver import VllmReceiver

    _save_tiny(tmp_path / "src")
    assert main(["export", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    receiver = VllmReceiver(object(), tmp_path / "out")  # an engine is needed only by apply()
    name = "model.layers.0.mlp.down_proj.weight"
    assert receiver.shapes[name] == (256, 384)
    assert receiver.shapes[name + "_scale_inv"] == (2, 3)
    with pytest.raises(ExportError, match="F8_E4M3"):
        checkpoint_shapes(tmp_path / "out")
