"""Unit tests of the embedded engine's parts (no Ray): tokenizer, task, advantages, sampler,
run-directory guard, CPU-feature checks, atomic checkpoints, metrics truncation."""

from __future__ import annotations

import json
import os

import pytest
import torch

from nemo_fp8_rl.config import RecipeError, load_recipe
from nemo_fp8_rl.config.project import TaskConfig, TinyModelConfig
from nemo_fp8_rl.engines.local import checkpoint as ckpt
from nemo_fp8_rl.engines.local import precision
from nemo_fp8_rl.engines.local.advantages import baseline_and_std, grpo_advantages
from nemo_fp8_rl.engines.local.metrics import MetricsLogger, read_metrics
from nemo_fp8_rl.runs import rundir
from nemo_fp8_rl.tiny.model import build_model, token_logprobs
from nemo_fp8_rl.tiny.sampling import SamplingParams, generate
from nemo_fp8_rl.tiny.task import (
    exact_match_reward,
    train_problems,
    validation_problems,
)
from nemo_fp8_rl.tiny.tokenizer import (
    build_tokenizer,
    decode_completions,
    encode_prompts,
)


def test_tokenizer_roundtrip_and_left_padding(tmp_path):
    tok = build_tokenizer()
    assert len(tok) == 49
    ids, mask = encode_prompts(tok, ["12+3=", "1+1="])
    assert ids[0, 0] == tok.bos_token_id and ids[1, 0] == tok.pad_token_id
    assert mask.tolist() == [[1] * 6, [0] + [1] * 5]
    assert decode_completions(tok, ids[:1, 1:]) == ["12+3="]
    two, eos, pad = tok.convert_tokens_to_ids("2"), tok.eos_token_id, tok.pad_token_id
    assert decode_completions(tok, torch.tensor([[two, eos, two], [pad, two, two]])) == ["2", ""]
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path).convert_tokens_to_ids(list("7+")) == (
        tok.convert_tokens_to_ids(list("7+"))
    )
    with pytest.raises(ValueError, match="not in the tiny tokenizer"):
        encode_prompts(tok, ["1+X="])


def test_task_is_deterministic_and_reward_is_exact_match():
    cfg = TaskConfig()
    assert train_problems(cfg, 3, 5) == train_problems(cfg, 3, 5)
    assert train_problems(cfg, 3, 5) != train_problems(cfg, 4, 5)
    p = validation_problems(cfg)
    assert len(p.prompts) == 256
    a, b = p.prompts[0][:-1].split("+")
    assert p.answers[0] == str(int(a) + int(b))
    r = exact_match_reward(["57", "57<eos>", "58", "570", "5"], ["57"] * 5)
    assert r.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_leave_one_out_baseline_matches_definition():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    base, std = baseline_and_std(rewards, 4, leave_one_out=True)
    g = rewards[:4]
    for i in range(4):
        others = torch.cat([g[:i], g[i + 1 :]])
        assert base[i] == pytest.approx(others.mean().item())
        assert std[i] == pytest.approx(others.std(unbiased=True).item(), abs=1e-6)
    assert base[4:].tolist() == [1.0] * 4 and std[4:].tolist() == [0.0] * 4
    adv = grpo_advantages(rewards, 4, leave_one_out=True, normalize=True)
    assert adv[4:].abs().sum() == 0
    assert adv[0] == pytest.approx((1 - 1 / 3) / (std[0].item() + 1e-6))
    plain = grpo_advantages(rewards, 4, leave_one_out=False, normalize=False)
    assert plain[:4].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo_advantages(torch.ones(6), 4, leave_one_out=True, normalize=True)


def test_generation_logprobs_equal_a_full_forward():
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_model(TinyModelConfig(), tok, seed=0)
    ids, mask = encode_prompts(tok, ["1+2=", "34+56=", "9+9="])
    params = SamplingParams(max_new_tokens=4, temperature=0.7)
    gen = generate(model, ids, mask, params, torch.Generator().manual_seed(0), 2, 0)
    again = generate(model, ids, mask, params, torch.Generator().manual_seed(0), 2, 0)
    assert torch.equal(gen.response_ids, again.response_ids)
    full = torch.cat([ids, gen.response_ids], 1)
    lp, _ = token_logprobs(model, full, torch.cat([mask, gen.mask.long()], 1), temperature=0.7)
    resp = lp[:, ids.shape[1] - 1 :]
    assert torch.allclose(resp * gen.mask, gen.logprobs, atol=1e-5)


def test_gpu_only_features_are_reported_with_the_fix():
    cfg = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8").config
    precision.check_cpu_support(cfg)
    cfg["policy"]["megatron_cfg"]["fp8_cfg"]["fp8_param"] = True
    cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"] = 2
    with pytest.raises(RecipeError) as err:
        precision.check_cpu_support(cfg, "tiny")
    text = str(err.value)
    assert "fp8_param=false" in text and "tensor_model_parallel_size=1" in text


def test_run_dir_of_another_recipe_is_not_overwritten(tmp_path):
    bf16 = load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16")
    fp8 = load_recipe("tiny/grpo-tiny-qwen3-cpu-fp8")
    rundir.prepare(tmp_path, bf16.config, bf16.to_yaml(), resume=False)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(
        rundir.RunDirError, match="holds a run of recipe 'grpo-tiny-qwen3-cpu-bf16'"
    ):
        rundir.prepare(tmp_path, fp8.config, fp8.to_yaml(), resume=False)
    assert (tmp_path / "metrics.jsonl").exists()
    foreign = tmp_path / "foreign"
    (foreign / "checkpoints").mkdir(parents=True)
    with pytest.raises(rundir.RunDirError, match="not a run of this recipe"):
        rundir.prepare(foreign, bf16.config, bf16.to_yaml(), resume=False)
    assert (foreign / "checkpoints").exists()
    longer = load_recipe("tiny/grpo-tiny-qwen3-cpu-bf16", ["grpo.max_num_steps=300"])
    rundir.prepare(tmp_path, longer.config, longer.to_yaml(), resume=True)
    assert (tmp_path / "metrics.jsonl").exists()


def test_checkpoint_is_atomic_and_pruned(tmp_path):
    root = tmp_path / "ckpt"
    assert ckpt.latest_checkpoint(root) is None
    for step, acc in ((1, 0.3), (2, 0.5), (3, 0.1)):
        ckpt.save_checkpoint(root, step, {"w": torch.full((2,), float(step))}, {"acc": acc})
    # a save killed half-way leaves a temporary directory and the old `latest`
    (root / ".tmp_step_4_x").mkdir()
    (root / ".tmp_step_4_x" / "state.pt").write_bytes(b"partial")
    state, info = ckpt.load_checkpoint(ckpt.latest_checkpoint(root))
    assert info["step"] == 3 and state["w"].tolist() == [3.0, 3.0]
    deleted = ckpt.prune_checkpoints(root, keep_top_k=1, metric="acc")
    assert sorted(d.name for d in deleted) == ["step_1"]  # best (2) kept, latest (3) kept
    ckpt.save_checkpoint(root, 4, {"w": torch.zeros(1)}, {"acc": 0.0})
    assert not (root / ".tmp_step_4_x").exists()
    (root / "latest").write_text("step_9\n")
    with pytest.raises(ckpt.CheckpointError, match="step_9"):
        ckpt.latest_checkpoint(root)


def test_checkpoint_manifest_is_verified_on_resume(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(root, 2, {"w": torch.arange(8.0)}, {"recipe": "a"})
    manifest = json.loads((root / "step_2" / ckpt.MANIFEST_FILE).read_text())
    assert manifest["recipe"] == "a" and manifest["step"] == 2
    assert set(manifest["files"]) == {ckpt.STATE_FILE, ckpt.INFO_FILE}
    assert ckpt.resume_point(root, "a", max_steps=2) == root / "step_2"
    with pytest.raises(ckpt.CheckpointError, match="belongs to recipe 'a', not 'b'"):
        ckpt.resume_point(root, "b", max_steps=5)
    with pytest.raises(ckpt.CheckpointError, match="already completed 2 steps") as err:
        ckpt.resume_point(root, "a", max_steps=1)
    assert err.value.code == 2
    state = root / "step_2" / ckpt.STATE_FILE
    data = bytearray(state.read_bytes())
    data[-10] ^= 0x80
    state.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="SHA-256"):
        ckpt.resume_point(root, "a", max_steps=5)


def test_metrics_resume_drops_steps_after_the_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(5):
        log.log(step, {"train/reward": step / 10, "x": float("nan")})
    log.close()
    assert read_metrics(tmp_path)[1] == {"step": 1, "train/reward": 0.1, "x": None}
    MetricsLogger(tmp_path, tensorboard=False, completed_steps=2).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    MetricsLogger(tmp_path, tensorboard=False, completed_steps=0).close()
    assert read_metrics(tmp_path) == []
    assert json.loads(json.dumps(os.fspath(tmp_path)))


def test_killing_a_saving_process_never_corrupts_latest(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "ckpt"
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from nemo_fp8_rl.engines.local.checkpoint import save_checkpoint\n"
        "for step in range(1, 10**6):\n"
        "    save_checkpoint(Path(sys.argv[1]), step, {'w': torch.full((250_000,), float(step))}, {})\n"
    )
    for delay in (0.0, 0.05, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", script, str(root)])
        deadline = time.monotonic() + 120
        while not (root / "latest").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)  # now somewhere inside a later save
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state, info = ckpt.load_checkpoint(ckpt.latest_checkpoint(root))
        assert bool((state["w"] == float(info["step"])).all())


def test_progress_bar_shows_step_and_headline_lines():
    from rich.console import Console

    from nemo_fp8_rl.engines.local.metrics import ProgressBar

    bar = ProgressBar(total=3, start=0, enabled=True, name="tiny", terminal=True)
    bar.update(
        {
            "train/reward": 0.5,
            "train/entropy": 0.4,
            "train/calib_low": 0.78,
            "train/calib_high": 1.25,
        }
    )
    bar.close()
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(*bar._bar.get_renderables())
    lines = [line.rstrip() for line in console.export_text().splitlines() if line.strip()]
    assert lines[-2].startswith("step 1/3")
    assert lines[-1] == "reward 0.500 L,H 0.780,1.250 ent 0.400"
    assert bar._headline(24) == "reward 0.500"  # whole fields that fit, never a cut one


def test_progress_without_a_terminal_prints_a_legend_and_lines(capsys):
    from nemo_fp8_rl.engines.local.metrics import LEGEND, ProgressBar

    bar = ProgressBar(total=20, start=0, enabled=True, name="tiny", terminal=False)
    for _ in range(20):
        bar.update({"train/reward": 0.5, "train/clip_lower_frac_neg": 0.01})
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "tiny: GRPO steps 0..20, a line every 2 steps" and LEGEND in lines[1]
    assert lines[2:] == [f"tiny step {k}/20 reward 0.500 clipL- 0.0100" for k in range(2, 21, 2)]


def test_async_grpo_is_refused_by_the_embedded_engine_and_loads_for_nemo_rl():
    """The async CPU recipe loads (NeMo RL's loop runs it, `--engine nemo`); the embedded
    engine, which is synchronous, refuses it and names that recipe."""
    cfg = load_recipe("tiny-nemo/grpo-tiny-qwen3-nemo-cpu-async-1off-fp8").config
    with pytest.raises(RecipeError) as err:
        precision.check_cpu_support(cfg, "tiny")
    text = str(err.value)
    assert "grpo.async_grpo.enabled" in text and "--engine nemo" in text
    assert "policy.generation.vllm_cfg.async_engine" in text


def test_a_warmup_that_misses_its_band_is_a_located_setting_error():
    """Three-digit addition needs more warm-up than the band allows here: the error names
    local.warmup and what to change, and is a user error (not reported as a bug)."""
    from nemo_fp8_rl.config.project import LocalConfig, WarmupConfig
    from nemo_fp8_rl.config.user_error import UserError
    from nemo_fp8_rl.tiny.tokenizer import build_tokenizer
    from nemo_fp8_rl.tiny.warmup import WarmupError, train_warmup

    local = LocalConfig(
        warmup=WarmupConfig(
            target_accuracy=(0.9, 1.0), max_steps=2, eval_every=1, eval_size=8, batch_size=8
        )
    )
    tokenizer = build_tokenizer()
    model = build_model(local.model, tokenizer, seed=0)
    with pytest.raises(WarmupError) as err:
        train_warmup(model, tokenizer, local, seed=0)
    assert isinstance(err.value, UserError)
    assert str(err.value).startswith("local.warmup: max_steps passed below the band")
    assert "Fix: raise local.warmup.max_steps" in str(err.value)


def test_trainer_quantized_refit_loads_for_nemo_rl_and_the_embedded_engine_refuses_it():
    """`refit.quantize_on: trainer` on the CPU loop's recipe loads (NeMo RL's loop on CPU runs
    it, `--engine nemo`); the embedded engine, which refits through refit.bridge, refuses it."""
    cfg = load_recipe(
        "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8", ["refit.quantize_on=trainer"]
    ).config
    assert cfg["refit"]["quantize_on"] == "trainer"
    with pytest.raises(RecipeError) as err:
        precision.check_cpu_support(cfg, "tiny")
    (issue,) = [i for i in err.value.issues if i.key == "refit.quantize_on"]
    assert "--engine nemo" in issue.fix and "refit.bridge" in issue.what
