"""MXFP8 (`vllm_cfg.is_mx`) on the CPU loop's generation worker, through NeMo RL's own code.

NeMo RL 7ea279a's `init_fp8` (ModelOpt MXFP8 config, its MXFP8 patches applied to the vLLM
stand-in names), `fp8.load_weights` and `quantize_mxfp8_weight` run as shipped; vLLM's
`mxfp8_e4m3_quantize` they call is the project's replica (`cpu.vllm_names`, held against vLLM
in tests/test_refit_mxfp8_vllm.py). Checked here: the served layers hold what NeMo RL's loading
produces, generation log-probs are those of the served MXFP8 weights, a generator-side refit
requantizes on receipt, and a trainer-side refit (`refit.quantize_on: trainer`) serves the same
bytes as the generator-side one for the same BF16 weights. v0.7.0 does not read `is_mx`: skipped
there (the recipes' refusal is in tests/test_nemo_blackwell.py).
"""

# ruff: noqa: F811  (the fixtures `nemo` and `checkpoint` are imported from that module)

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_nemo_contract import _skip_reason
from test_nemo_cpu_generation_worker import (  # noqa: F401 (fixtures)
    LAYERS,
    assert_logprobs_match,
    checkpoint,
    cpu_ipc,
    forward_logprobs,
    gen_config,
    generated_logprobs,
    make_worker,
    metadata,
    nemo,
    policy_export,
    prompts,
    refit,
    served_state,
)

from nemo_fp8_rl.refit.errors import RefitMismatch
from nemo_fp8_rl.refit.nemo_mxfp8 import quantize_mxfp8_like_nemo_rl

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]
MX = {"precision": "fp8", "is_mx": True}


@pytest.fixture
def mx_nemo(nemo: Any) -> Any:
    if not hasattr(nemo.fp8, "quantize_mxfp8_weight"):
        pytest.skip("this NeMo RL (v0.7.0) does not read is_mx")
    return nemo


def test_mxfp8_serves_nemo_rls_quantized_weights(mx_nemo: Any, checkpoint: Path) -> None:
    bf16 = make_worker(mx_nemo, gen_config(checkpoint))
    mx = make_worker(mx_nemo, gen_config(checkpoint, **MX, num_first_layers_in_bf16=1))
    layers = mx.model.model.layers
    assert mx.fp8.mx and layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    down = layers[1].mlp.down_proj  # 192 x 320: ten 1x32 blocks per row
    assert down.weight.dtype == torch.float8_e4m3fn
    assert down.weight_scale_from_checkpoint.shape == (192, 10)
    ref = bf16.model.model.layers[1].mlp.down_proj.weight
    with mx.fp8.globals():
        w, s = mx_nemo.fp8.quantize_mxfp8_weight(ref)  # NeMo RL's own function
    assert torch.equal(down.weight.view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(down.weight_scale_from_checkpoint, s)
    ours = quantize_mxfp8_like_nemo_rl(ref)
    assert torch.equal(ours[0].view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(ours[1], s)
    out = bf16.generate(prompts(mx_nemo, checkpoint), greedy=True)
    diff = (
        torch.cat(forward_logprobs(bf16.model, out)) - torch.cat(forward_logprobs(mx.model, out))
    ).abs()
    assert 1e-3 < float(diff.max()) < 1.0, diff.max()
    mx_out = mx.generate(prompts(mx_nemo, checkpoint), greedy=True)
    want = torch.cat(forward_logprobs(mx.model, mx_out))
    assert_logprobs_match(torch.cat(generated_logprobs(mx_out)), want)


def test_trainer_side_mxfp8_refit_serves_what_the_generator_side_serves(
    mx_nemo: Any, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same BF16 weights refit both ways: NeMo RL quantizing on receipt (generator) and
    the trainer's MXFP8 pairs loaded as sent; every served tensor equal, byte for byte."""
    from nemo_fp8_rl.engines.nemo.worker.trainer_refit import (
        plan_layout,
        quantized_stream,
        rules_for_worker,
        shape_only,
    )

    cfg = gen_config(checkpoint, **MX)
    export = policy_export(checkpoint, seed=3)
    generator = make_worker(mx_nemo, cfg)
    generator.prepare_refit_info(metadata(export))
    with cpu_ipc(mx_nemo, monkeypatch):
        assert refit(mx_nemo, generator, export)

    trainer = make_worker(mx_nemo, cfg, trainer=True)
    layout, entries = plan_layout(export, rules_for_worker({"generation": cfg}, LAYERS))
    info = {n: (t.shape, t.dtype) for n, t in shape_only(entries)}
    stream = list(quantized_stream(export, layout))
    assert info == metadata(stream)
    scales = [n for n in info if n.endswith("_scale_from_checkpoint")]
    assert len(scales) == 7 * LAYERS and all(info[n][1] == torch.uint8 for n in scales)
    trainer.prepare_refit_info(info)
    with cpu_ipc(mx_nemo, monkeypatch):
        assert refit(mx_nemo, trainer, stream)

    a, b = served_state(generator), served_state(trainer)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name
    sent = sum(t.numel() * t.element_size() for _, t in stream)
    bf16 = sum(t.numel() * t.element_size() for _, t in export)
    assert sent < bf16


def test_block_scales_sent_to_an_mxfp8_worker_are_refused(mx_nemo: Any, checkpoint: Path) -> None:
    from nemo_fp8_rl.engines.nemo.worker.trainer_refit import (
        plan_layout,
        rules_for_worker,
        shape_only,
    )

    worker = make_worker(mx_nemo, gen_config(checkpoint, **MX), trainer=True)
    block = gen_config(checkpoint, precision="fp8")
    _, entries = plan_layout(
        policy_export(checkpoint), rules_for_worker({"generation": block}, LAYERS)
    )
    info = {n: (t.shape, t.dtype) for n, t in shape_only(entries)}
    with pytest.raises(RefitMismatch, match="no weight was loaded") as err:
        worker.prepare_refit_info(info)
    assert "_scale_inv: the served model holds no such tensor" in str(err.value)
