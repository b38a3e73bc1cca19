"""`refit.quantize_on: trainer` without NeMo RL: worker choice, and the generator-side checks on
a payload (the contract tests run the same checks inside NeMo RL's vLLM loading path)."""

from __future__ import annotations

import types

import pytest
import torch

from nemo_fp8_rl.config.user_error import UserError
from nemo_fp8_rl.engines.nemo.driver import refit_workers
from nemo_fp8_rl.engines.nemo.driver.worker_env import (
    ASYNC_GENERATION_WORKER_FQN,
    GENERATION_WORKER_FQN,
    TRAINER_FP8_WORKER_FQN,
    VLLM_ASYNC_WORKER_FQN,
    VLLM_WORKER_FQN,
    WORKER_FQN,
)
from nemo_fp8_rl.engines.nemo.worker.trainer_refit import QuantizeOnTrainer
from nemo_fp8_rl.engines.nemo.worker.vllm_refit import (
    check_chunk,
    check_refit_info,
    scale_shape,
)
from nemo_fp8_rl.refit.errors import RefitMismatch

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
    assert resolve(VLLM_ASYNC_WORKER_FQN, {}) == ASYNC_GENERATION_WORKER_FQN
    assert registered == [
        (GENERATION_WORKER_FQN, VLLM_WORKER_FQN),
        (ASYNC_GENERATION_WORKER_FQN, VLLM_ASYNC_WORKER_FQN),
    ]
    with pytest.raises(refit_workers.GenerationWorkerError, match="quantize_on: generator"):
        resolve("nemo_rl.modelopt.VllmQuantGenerationWorker", {})


def test_generator_path_gets_the_checked_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """`refit.quantize_on: generator`: NeMo RL's vLLM workers become the project's checked ones
    (the metadata check before any weight moves); a worker NeMo RL chose otherwise is kept."""
    registered = []
    monkeypatch.setattr(refit_workers, "register_worker", lambda *a: registered.append(a) or "py")
    resolve = refit_workers.resolver(lambda default, cfg: default, "generator")
    assert resolve(VLLM_WORKER_FQN, {}) == refit_workers.CHECKED_GENERATION_WORKER_FQN
    assert resolve(VLLM_ASYNC_WORKER_FQN, {}) == refit_workers.CHECKED_ASYNC_GENERATION_WORKER_FQN
    assert [fqn for fqn, _ in registered] == [
        refit_workers.CHECKED_GENERATION_WORKER_FQN,
        refit_workers.CHECKED_ASYNC_GENERATION_WORKER_FQN,
    ]
    modelopt = "nemo_rl.modelopt.VllmQuantGenerationWorker"
    assert resolve(modelopt, {}) == modelopt


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
    with pytest.raises(RefitMismatch) as err:
        check_refit_info(info, slabs_fp8)
    assert (says or "unexpanded") in str(err.value)
    assert str(err.value).startswith("prepare_refit_info:") and "Fix:" in str(err.value)


def test_chunk_must_match_the_metadata() -> None:
    info = good()
    check_chunk([(Q, torch.zeros(300, 200, dtype=FP8))], info)
    with pytest.raises(RefitMismatch, match="announced"):
        check_chunk([(Q, torch.zeros(300, 200, dtype=BF16))], info)
    with pytest.raises(RefitMismatch, match="not in the refit metadata"):
        check_chunk([("model.other.weight", torch.zeros(1))], info)


# ---- the Megatron worker's refit stream (QuantizeOnTrainer) ---------------------------------


class RecordingPolicyWorker:
    """NeMo RL's `MegatronPolicyWorkerImpl` as the mixin sees it (its import needs Megatron-Bridge
    and a GPU): `_iter_params_with_optional_kv_scales(kv_scales=None, conversion_tasks=None)`
    yields the BF16 export and records its arguments; `prepare_refit_info` collects
    `{name: (shape, dtype)}` from that stream, as NeMo RL's does."""

    def __init__(self, export: list[tuple[str, torch.Tensor]]) -> None:
        self.export = export
        self.stream_calls: list[dict] = []
        self.cfg = {"generation": {"vllm_cfg": {"precision": "fp8", "num_last_layers_in_bf16": 1}}}
        layers = types.SimpleNamespace(num_layers=2)
        self.megatron_bridge = types.SimpleNamespace(transformer_config=layers)

    def _iter_params_with_optional_kv_scales(self, kv_scales=None, conversion_tasks=None):
        self.stream_calls.append({"kv_scales": kv_scales, "conversion_tasks": conversion_tasks})
        yield from self.export

    def prepare_refit_info(self) -> dict:
        return {n: (t.shape, t.dtype) for n, t in self._iter_params_with_optional_kv_scales()}


class TrainerWorker(QuantizeOnTrainer, RecordingPolicyWorker):
    pass


def export() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = [("model.embed_tokens.weight", torch.randn(300, 128, generator=g).bfloat16())]
    for i in range(2):
        out.append(
            (
                f"model.layers.{i}.self_attn.q_proj.weight",
                torch.randn(256, 128, generator=g).bfloat16(),
            )
        )
        out.append((f"model.layers.{i}.input_layernorm.weight", torch.ones(128).bfloat16()))
    out.append(("draft.model.layers.0.self_attn.q_proj.weight", torch.ones(128, 128).bfloat16()))
    out.append(("model.layers.0.self_attn.k_scale", torch.ones(1)))
    return out


def test_worker_metadata_describes_the_stream_it_then_sends() -> None:
    worker = TrainerWorker(export())
    with pytest.raises(RuntimeError, match="before prepare_refit_info"):
        list(worker._iter_params_with_optional_kv_scales())
    info = worker.prepare_refit_info()
    sent = list(
        worker._iter_params_with_optional_kv_scales(kv_scales={"a": 1.0}, conversion_tasks=[7])
    )
    assert {n: (t.shape, t.dtype) for n, t in sent} == info
    assert worker.stream_calls[-1] == {"kv_scales": {"a": 1.0}, "conversion_tasks": [7]}
    dtypes = {n: t.dtype for n, t in sent}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == FP8  # layer 1 is the last, BF16
    assert dtypes["model.layers.0.self_attn.q_proj.weight_scale_inv"] == F32
    assert dtypes["model.layers.1.self_attn.q_proj.weight"] == BF16
    assert dtypes["draft.model.layers.0.self_attn.q_proj.weight"] == BF16
    assert info["model.layers.0.self_attn.q_proj.weight_scale_inv"][0] == (2, 1)
    unchanged = dict(export())
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.k_scale"):
        assert torch.equal(dict(sent)[name], unchanged[name])


def test_bf16_rollout_is_refused_by_the_worker() -> None:
    worker = TrainerWorker(export())
    worker.cfg = {"generation": {"vllm_cfg": {"precision": "bfloat16"}}}
    with pytest.raises(UserError, match="precision"):
        worker.prepare_refit_info()
