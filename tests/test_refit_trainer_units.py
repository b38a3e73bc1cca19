"""`refit.quantize_on: trainer` without NeMo RL: worker choice, and the generator-side checks on
a payload (the contract tests run the same checks inside NeMo RL's vLLM loading path)."""

from __future__ import annotations

import pytest
import torch

from nemo_fp8_rl.engines.nemo import refit_workers
from nemo_fp8_rl.engines.nemo.vllm_refit import (
    RefitPayloadError,
    check_chunk,
    check_refit_info,
    scale_shape,
)
from nemo_fp8_rl.engines.nemo.worker_env import (
    GENERATION_WORKER_FQN,
    TRAINER_FP8_WORKER_FQN,
    VLLM_WORKER_FQN,
    WORKER_FQN,
)

FP8, F32, BF16 = torch.float8_e4m3fn, torch.float32, torch.bfloat16
Q = "model.layers.0.self_attn.q_proj.weight"


def holds_fp8(name: str) -> bool:
    return name.endswith("proj.weight")


def good() -> dict:
    return {
        "model.embed_tokens.weight": ((300, 200), BF16),
        Q: ((300, 200), FP8),
        Q + "_scale_inv": ((3, 2), F32),
        "model.layers.0.self_attn.k_scale": ((1,), F32),
        "draft.model.fc.weight": ((4, 4), BF16),
    }


def test_policy_worker_choice() -> None:
    assert refit_workers.policy_worker_fqn(calibrated=False, quantize_on="generator") is None
    assert refit_workers.policy_worker_fqn(calibrated=True, quantize_on="generator") == WORKER_FQN
    for calibrated in (False, True):
        fqn = refit_workers.policy_worker_fqn(calibrated=calibrated, quantize_on="trainer")
        assert fqn == TRAINER_FP8_WORKER_FQN


def test_generation_worker_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    registered = []
    monkeypatch.setattr(refit_workers, "register_worker", lambda *a: registered.append(a) or "py")
    resolve = refit_workers.resolver(lambda default, cfg: default)
    assert resolve(VLLM_WORKER_FQN, {}) == GENERATION_WORKER_FQN
    assert registered == [(GENERATION_WORKER_FQN, VLLM_WORKER_FQN)]
    with pytest.raises(refit_workers.GenerationWorkerError, match="quantize_on: generator"):
        resolve("nemo_rl.x.VllmAsyncGenerationWorker", {})


def test_scale_grid() -> None:
    assert scale_shape((128, 256)) == (1, 2)
    assert scale_shape((129, 1)) == (2, 1)


def test_good_metadata_passes() -> None:
    check_refit_info(good(), holds_fp8)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({Q: ((300, 200), BF16)}, "not quantized on the trainer"),
        ({Q + "_scale_inv": ((2, 2), F32)}, "need [3, 2]"),
        ({Q + "_scale_inv": ((3, 2), BF16)}, "torch.float32"),
        ({Q + "_scale_inv": None}, "missing scale"),
        ({"model.norm.weight_scale_inv": ((1, 1), F32)}, "unexpected name"),
        ({"model.embed_tokens.weight": ((300, 200), FP8)}, "higher precision"),
        ({"model.layers.0.mlp.experts.gate_up_proj": ((8, 256, 128), BF16)}, None),
    ],
)
def test_bad_metadata_is_refused(edit: dict, says: str | None) -> None:
    info = good()
    for name, value in edit.items():
        info.pop(name, None)
        if value is not None:
            info[name] = value
    slabs_fp8 = lambda n: holds_fp8(n) or n.endswith("experts.gate_up_proj")  # noqa: E731
    with pytest.raises(RefitPayloadError) as err:
        check_refit_info(info, slabs_fp8)
    assert (says or "unexpanded") in str(err.value)
    assert str(err.value).startswith("error: prepare_refit_info:") and "Fix:" in str(err.value)


def test_chunk_must_match_the_metadata() -> None:
    info = good()
    check_chunk([(Q, torch.zeros(300, 200, dtype=FP8))], info)
    with pytest.raises(RefitPayloadError, match="announced"):
        check_chunk([(Q, torch.zeros(300, 200, dtype=BF16))], info)
    with pytest.raises(RefitPayloadError, match="not in the refit metadata"):
        check_chunk([("model.other.weight", torch.zeros(1))], info)
