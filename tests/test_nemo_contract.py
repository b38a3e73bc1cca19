"""Contract with a real NeMo RL source tree (`NEMO_RL_SRC`, also on PYTHONPATH, Python >= 3.12).

Run them with `scripts/nemo-rl-contract.sh /path/to/nemo-rl`, which builds the environment.
They import NeMo RL's own config classes and loss code on CPU: every recipe's hand-off is
validated by `MasterConfig`, and the project's loss is driven through NeMo RL's loss-calling
path (`wrap_loss_fn_with_input_preparation`, `SequencePackingLossWrapper`, `prepare_loss_input`)
next to NeMo RL's `ClippedPGLossFn`.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from nemo_fp8_rl.config import find_recipes, load_recipe, short_name
from nemo_fp8_rl.engines.nemo.driver import compat
from nemo_fp8_rl.engines.nemo.driver.handoff import (
    HandoffError,
    to_nemo_config,
    validate_with_nemo_rl,
)
from nemo_fp8_rl.engines.nemo.driver.runner import WORKER_FQN
from nemo_fp8_rl.engines.nemo.worker.loss import BF16_CURR, BF16_PREV, NemoCalibratedLoss
from nemo_fp8_rl.engines.nemo.worker.observations import PAYLOAD_KEY

SRC = os.environ.get("NEMO_RL_SRC")


def _skip_reason() -> str | None:
    if not SRC:
        return "NEMO_RL_SRC is not set (run scripts/nemo-rl-contract.sh /path/to/nemo-rl)"
    if sys.version_info < (3, 12):
        return (
            "NeMo RL's config classes need Python >= 3.12 (scripts/nemo-rl-contract.sh builds one)"
        )
    spec = importlib.util.find_spec("nemo_rl")
    if spec is None or not str(spec.origin).startswith(str(Path(SRC).resolve())):
        return f"nemo_rl from {SRC} is not on PYTHONPATH (scripts/nemo-rl-contract.sh sets it)"
    return None


pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
]

if _skip_reason() is None:
    from nemo_rl.algorithms.loss.interfaces import LossInputType
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_rl.algorithms.loss.utils import prepare_loss_input
    from nemo_rl.algorithms.loss.wrapper import (
        SequencePackingLossWrapper,
        wrap_loss_fn_with_input_preparation,
    )
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict


torch.set_num_threads(1)
RECIPES = find_recipes()
VOCAB = 40


def test_tree_is_a_supported_nemo_rl() -> None:
    info = compat.detect()
    assert info.supported, info.describe()
    print(f"\nNeMo RL under test: {info.describe()}")


@pytest.mark.parametrize("path", RECIPES, ids=[short_name(p) for p in RECIPES])
def test_every_recipe_handoff_validates_with_master_config(path) -> None:
    recipe = load_recipe(path)
    master = validate_with_nemo_rl(to_nemo_config(recipe))
    grpo = master.grpo if isinstance(master.grpo, dict) else vars(master.grpo)  # v0.7.0: a dict
    assert grpo["num_prompts_per_step"] == recipe.config["grpo"]["num_prompts_per_step"]
    assert (
        master.policy["train_global_batch_size"]
        == recipe.config["policy"]["train_global_batch_size"]
    )
    fp8 = recipe.config["policy"]["megatron_cfg"]["fp8_cfg"]["enabled"]
    assert master.policy["megatron_cfg"]["fp8_cfg"]["enabled"] == fp8


def test_rejected_handoff_names_each_key() -> None:
    cfg = to_nemo_config(load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"))
    cfg["policy"]["train_micro_batch_size"] = "one"
    del cfg["cluster"]["num_nodes"]
    with pytest.raises(HandoffError) as err:
        validate_with_nemo_rl(cfg)
    text = str(err.value)
    assert "policy.train_micro_batch_size" in text and "cluster.num_nodes" in text


def test_interfaces_the_engine_calls_exist() -> None:
    from nemo_rl.algorithms import grpo
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.distributed.worker_groups import RayWorkerGroup
    from nemo_rl.models.policy.lm_policy import Policy

    params = list(inspect.signature(grpo.grpo_train).parameters.values())[:12]
    assert all(
        p.kind == p.POSITIONAL_OR_KEYWORD for p in params
    )  # the runner passes them by position
    names = [p.name for p in params]
    assert names[:2] == ["policy", "policy_generation"] and names[2].endswith("dataloader")
    assert names[3:6] == ["val_dataloader", "tokenizer", "loss_fn"]
    assert names[6:] == [
        "task_to_env",
        "val_task_to_env",
        "logger",
        "checkpointer",
        "grpo_save_state",
        "master_config",
    ]
    assert "policy_factory" in inspect.signature(grpo.setup).parameters
    assert {"eval_mode", "gbs", "mbs", "timer"} <= set(inspect.signature(Policy.train).parameters)
    assert "timer" in inspect.signature(Policy.get_logprobs).parameters
    assert "worker_extension_cls_fqn" in inspect.signature(Policy.__init__).parameters
    assert hasattr(RayWorkerGroup, "run_all_workers_single_data")
    assert isinstance(ACTOR_ENVIRONMENT_REGISTRY, dict) and hasattr(PY_EXECUTABLES, "MCORE")
    # checkpoint layout the calibrator state relies on: <step dir>/policy/weights
    assert '"policy", "weights"' in inspect.getsource(grpo.grpo_train).replace("\n", " ").replace(
        "  ", ""
    )


def test_worker_extension_base_exists_in_the_tree() -> None:
    import ast

    worker_src = Path(SRC, "nemo_rl/models/policy/workers/megatron_policy_worker.py").read_text()
    classes = {n.name: n for n in ast.parse(worker_src).body if isinstance(n, ast.ClassDef)}
    impl = classes["MegatronPolicyWorkerImpl"]
    methods = {n.name for n in impl.body if isinstance(n, ast.FunctionDef)}
    assert {"get_logprobs", "train"} <= methods and "self.model =" in worker_src
    # the LR schedule ticks once per train() call, on the attribute hold_lr_schedule holds
    assert "self.scheduler.step(increment=gbs)" in worker_src
    from nemo_rl.models.policy.utils import get_runtime_env_for_policy_worker

    assert callable(get_runtime_env_for_policy_worker)
    assert WORKER_FQN.endswith("ShadowMegatronPolicyWorker")


# ---- the loss through NeMo RL's loss-calling code ------------------------------------------
def _batch(rows: int = 6, seq: int = 9, seed: int = 0) -> BatchedDataDict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 7, 8, 9, 6, 9])[:rows]
    mask = torch.zeros(rows, seq)
    for i, n in enumerate(lengths.tolist()):
        mask[i, 3:n] = 1.0
    prev = -torch.rand(rows, seq, generator=g) * 3
    prev[:, 0] = 0
    adv = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0).unsqueeze(1).expand(rows, seq)
    return BatchedDataDict(
        {
            "input_ids": torch.randint(0, VOCAB, (rows, seq), generator=g),
            "input_lengths": lengths,
            "advantages": adv.clone(),
            "prev_logprobs": prev,
            "generation_logprobs": prev + 0.05 * torch.randn(rows, seq, generator=g),
            "reference_policy_logprobs": prev + 0.1 * torch.randn(rows, seq, generator=g),
            "token_mask": mask,
            "sample_mask": torch.ones(rows),
        }
    )


def _loss_cfg(*overrides: str) -> dict:
    base = ["loss_fn.calibration.min_tokens=4", "loss_fn.reference_policy_kl_penalty=0.01"]
    return load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", [*base, *overrides]).section(
        "loss_fn"
    )


@pytest.fixture(scope="module")
def tp_group(tmp_path_factory):
    """A one-rank gloo group: NeMo RL's Megatron path computes log-probs vocab-parallel.

    (Its non-parallel branch moves token ids to CUDA, so the Megatron branch is the CPU one.)
    """
    import torch.distributed as dist

    owns = not dist.is_initialized()
    if owns:
        init = f"file://{tmp_path_factory.mktemp('pg') / 'store'}"
        dist.init_process_group("gloo", init_method=init, world_size=1, rank=0)
    yield dist.group.WORLD
    if owns:
        dist.destroy_process_group()


def _run_padded(loss_fn, data, logits, group):
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    return wrap_loss_fn_with_input_preparation(
        logits,
        data,
        data["sample_mask"].sum(),
        mask.sum(),
        loss_fn=loss_fn,
        prepare_fn=prepare_loss_input,
        vocab_parallel_rank=0,
        vocab_parallel_group=group,
    )


def test_loss_matches_clipped_pg_loss_fn_through_nemo_rl_input_preparation(tp_group) -> None:
    cfg = _loss_cfg("loss_fn.calibration.enabled=false")
    nemo_cfg = {k: v for k, v in cfg.items() if k != "calibration"}
    theirs = ClippedPGLossFn(ClippedPGLossConfig(**nemo_cfg))
    ours = NemoCalibratedLoss(cfg)
    assert ours.input_type == LossInputType.LOGPROB  # identity: NeMo RL's own enum member
    assert ours.loss_type.value == theirs.loss_type.value
    data = _batch()
    logits = torch.randn(
        6, 9, VOCAB, generator=torch.Generator().manual_seed(5), requires_grad=True
    )
    loss_t, m_t = _run_padded(theirs, data, logits, tp_group)
    (g_t,) = torch.autograd.grad(loss_t, logits)
    loss_o, m_o = _run_padded(ours, data, logits, tp_group)
    (g_o,) = torch.autograd.grad(loss_o, logits)
    torch.testing.assert_close(loss_o, loss_t)
    torch.testing.assert_close(g_o, g_t)
    for key, value in m_t.items():
        value = value.item() if isinstance(value, torch.Tensor) else value
        assert m_o[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def _packed(data, logits):
    """Pack the padded batch the way Megatron's sequence packing hands it to the loss."""
    lengths = data["input_lengths"].tolist()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    packed = torch.cat([logits[i, :n] for i, n in enumerate(lengths)]).unsqueeze(0)
    return packed, cu


def test_shadow_payload_survives_sequence_packing_and_equals_the_padded_call(tp_group) -> None:
    cfg = _loss_cfg()
    data = _batch()
    g = torch.Generator().manual_seed(9)
    data[BF16_PREV] = data["prev_logprobs"] + 0.02 * torch.randn(6, 9, generator=g)
    data[BF16_CURR] = data["prev_logprobs"] + 0.3 * torch.randn(6, 9, generator=g)
    logits = torch.randn(6, 9, VOCAB, generator=torch.Generator().manual_seed(5))
    padded_loss, padded = _run_padded(NemoCalibratedLoss(cfg), data, logits, tp_group)

    packed_logits, cu = _packed(data, logits)
    wrapper = SequencePackingLossWrapper(
        loss_fn=NemoCalibratedLoss(cfg),
        prepare_fn=partial(prepare_loss_input),
        cu_seqlens_q=cu,
        vocab_parallel_rank=0,
        vocab_parallel_group=tp_group,
    )
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    packed_loss, packed_m = wrapper(packed_logits, data, data["sample_mask"].sum(), mask.sum())
    torch.testing.assert_close(packed_loss, padded_loss)
    assert packed_m["loss"] == pytest.approx(padded["loss"], rel=1e-5)
    a, b = packed_m[PAYLOAD_KEY], padded[PAYLOAD_KEY]
    assert len(a) == 6 and len(b) == 1 and a.num_tokens == b.num_tokens == int(mask.sum())
    stats = []
    for payload in (a, b):
        cal = NemoCalibratedLoss(cfg).calibrator
        payload.replay(cal)
        stats.append(cal.update(0))
    assert stats[0].keys() == stats[1].keys()
    for key in stats[0]:
        assert stats[0][key] == pytest.approx(stats[1][key], rel=1e-5, nan_ok=True), key


def test_nemo_rl_sharding_keeps_shadow_keys_aligned() -> None:
    data = _batch(rows=6)
    data[BF16_PREV] = data["prev_logprobs"] * 2
    data[BF16_CURR] = data["prev_logprobs"] * 3
    shards = data.shard_by_batch_size(2, batch_size=6)
    for shard in shards:
        torch.testing.assert_close(shard[BF16_PREV], shard["prev_logprobs"] * 2)
        torch.testing.assert_close(shard[BF16_CURR], shard["prev_logprobs"] * 3)
    part = data.slice(2, 4)
    assert isinstance(part, BatchedDataDict) and part[BF16_PREV].shape == (2, 9)
    for mb in shards[0].make_microbatch_iterator(1):  # the Megatron worker's micro-batches
        torch.testing.assert_close(mb[BF16_CURR], mb["prev_logprobs"] * 3)


def test_everything_the_runner_imports_resolves() -> None:
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.utils import setup_response_data
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.models.generation import configure_generation_config

    assert all(map(callable, (get_tokenizer, setup_response_data, init_ray)))
    params = inspect.signature(configure_generation_config).parameters
    assert {"has_refit_draft_weights", "trains_mtp"} <= set(params)


def test_metrics_tee_around_nemo_rl_logger_matches_its_tensorboard_events(tmp_path) -> None:
    """NeMo RL's Logger (TensorBoard backend) behind the tee: same names and values in both."""
    from nemo_rl.utils.logger import Logger

    from nemo_fp8_rl.analysis.rundata import (
        find_event_files,
        merge_rows,
        read_event_file,
        read_jsonl,
    )
    from nemo_fp8_rl.engines.nemo.driver.metrics_log import LOAD_AVERAGE, MetricsTee

    cfg = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8").config["logger"]
    cfg = {**cfg, "log_dir": str(tmp_path / "logs"), "wandb_enabled": False}
    cfg.update(tensorboard_enabled=True, mlflow_enabled=False, swanlab_enabled=False)
    cfg["monitor_gpus"] = False
    tee = MetricsTee(Logger(cfg), tmp_path / "metrics.jsonl")
    tee.log_metrics({"loss": 0.25, "calib_low": 0.78, "calib_alpha": 0.031}, 1, prefix="train")
    tee.log_metrics({"shadow": 1.5}, 1, prefix="timing/train")
    tee.log_metrics({"loss": 0.2, "calib_low": 0.78}, 2, prefix="train")
    for backend in getattr(tee, "loggers", []):
        writer = getattr(backend, "writer", None)
        if writer is not None:
            writer.flush()
    jsonl, _ = read_jsonl(tmp_path / "metrics.jsonl")
    events = merge_rows(read_event_file(p)[0] for p in find_event_files(tmp_path / "logs"))
    # the machine's load with each train line: the project's own measurement, not NeMo RL's metric
    assert all(row.pop(LOAD_AVERAGE) >= 0 for row in jsonl.values())
    assert jsonl[1] == {
        "train/loss": 0.25,
        "train/calib_low": 0.78,
        "train/calib_alpha": 0.031,
        "timing/train/shadow": 1.5,
    }
    for step, row in jsonl.items():
        for name, value in row.items():
            assert events[step][name] == pytest.approx(value, rel=1e-6), (step, name)


def test_calibrator_state_survives_nemo_rl_checkpoint_manager(tmp_path) -> None:
    """Saved through ShadowPolicy into NeMo RL's tmp step folder, renamed by NeMo RL, restored."""
    from nemo_rl.utils.checkpoint import CheckpointManager
    from test_nemo_fakes import FakeNemoPolicy, make_batch

    from nemo_fp8_rl.engines.nemo.driver import runner
    from nemo_fp8_rl.engines.nemo.driver.shadow import ShadowPolicy

    overrides = ["loss_fn.calibration.min_tokens=8", "loss_fn.calibration.max_step_low=0.2"]
    recipe = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8", overrides, run_dir=tmp_path / "run")
    manager = CheckpointManager(to_nemo_config(recipe)["checkpointing"])
    policy, loss = FakeNemoPolicy(lr=6.0), runner.build_loss(recipe, None)
    shadow = ShadowPolicy(
        policy,
        loss,
        start_step=0,
        global_batch_size=8,
        switch=policy.switch,
        hold_schedule=policy.hold_schedule,
    )
    shadow.train(make_batch(policy), loss)
    assert loss.calibrator.bounds != loss.calibrator.nominal
    path = manager.init_tmp_checkpoint(1, {"total_steps": 1})
    shadow.save_checkpoint(
        weights_path=os.path.join(path, "policy", "weights"),
        optimizer_path=None,
        tokenizer_path=None,
    )
    manager.finalize_checkpoint(path)
    latest = manager.get_latest_checkpoint_path()
    assert Path(latest).name == "step_1"
    assert runner.build_loss(recipe, latest).calibrator.bounds == loss.calibrator.bounds


def test_shadow_payload_survives_the_fused_packed_loss(tp_group) -> None:
    """`policy.sequence_packing.fuse_loss: true` (the DeepSeek-V3 recipes): NeMo RL's
    `SequencePackingFusionLossWrapper` with `prepare_packed_loss_input` calls the loss once per
    packed micro-batch; the loss, its metrics and the shadow payload equal the padded call's."""
    from nemo_rl.algorithms.loss.utils import prepare_packed_loss_input
    from nemo_rl.algorithms.loss.wrapper import SequencePackingFusionLossWrapper

    cfg = _loss_cfg()
    data = _batch()
    g = torch.Generator().manual_seed(9)
    data[BF16_PREV] = data["prev_logprobs"] + 0.02 * torch.randn(6, 9, generator=g)
    data[BF16_CURR] = data["prev_logprobs"] + 0.3 * torch.randn(6, 9, generator=g)
    logits = torch.randn(6, 9, VOCAB, generator=torch.Generator().manual_seed(5))
    padded_loss, padded = _run_padded(NemoCalibratedLoss(cfg), data, logits, tp_group)
    packed_logits, cu = _packed(data, logits)
    wrapper = SequencePackingFusionLossWrapper(
        loss_fn=NemoCalibratedLoss(cfg),
        prepare_fn=prepare_packed_loss_input,
        cu_seqlens_q=cu,
        vocab_parallel_rank=0,
        vocab_parallel_group=tp_group,
    )
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    fused_loss, fused = wrapper(packed_logits, data, data["sample_mask"].sum(), mask.sum())
    torch.testing.assert_close(fused_loss, padded_loss)
    assert fused["loss"] == pytest.approx(padded["loss"], rel=1e-5)
    a, b = fused[PAYLOAD_KEY], padded[PAYLOAD_KEY]
    assert a.num_tokens == b.num_tokens == int(mask.sum())
    for key in ("fp8_ratio", "bf16_ratio", "weights"):
        torch.testing.assert_close(
            torch.cat([r[key] for r in a.records]), torch.cat([r[key] for r in b.records])
        )
