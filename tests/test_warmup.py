"""The supervised warm-up: fixed step count, or until a target accuracy band (real tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from nemo_fp8_rl.config.project import LocalConfig, WarmupConfig
from nemo_fp8_rl.engines.local.runner import warmup_metrics
from nemo_fp8_rl.tiny.model import build_model
from nemo_fp8_rl.tiny.tokenizer import build_tokenizer
from nemo_fp8_rl.tiny.warmup import (
    WarmupError,
    greedy_accuracy,
    warm_start,
    warmup_eval_problems,
)
from nemo_fp8_rl.tiny.warmup_store import cache_key, config_key

# one-digit addition with a 1-layer model: the phase transition comes within ~100 steps
_SMALL = {"model": {"num_layers": 1}, "task": {"digits": 1}}


def _local(**warmup) -> LocalConfig:
    return LocalConfig(**_SMALL, warmup={"batch_size": 64, "lr": 3e-3, **warmup})


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_FP8_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NEMO_FP8_RL_WARMUPS", str(tmp_path / "no-shipped"))
    torch.set_num_threads(1)


def test_band_warmup_stops_at_the_first_check_inside_and_is_cached():
    tok = build_tokenizer()
    local = _local(target_accuracy=(0.3, 1.0), eval_every=10, max_steps=400)
    model = build_model(local.model, tok, seed=1)
    info = warm_start(model, tok, local, seed=1)
    assert not info["cached"]
    steps, acc = info["steps"], info["accuracy"]
    assert steps % 10 == 0 and 0 < steps < 400
    assert 0.3 <= acc <= 1.0
    # every earlier check was below the band; the recorded accuracy is the model's
    assert all(a < 0.3 for _, a in info["checks"][:-1])
    assert info["checks"][-1] == [steps, acc]
    held_out = warmup_eval_problems(local)
    assert greedy_accuracy(model, tok, held_out, local.task.digits) == pytest.approx(acc)
    # the cache returns the same start point and records the steps
    again = build_model(local.model, tok, seed=1)
    cached = warm_start(again, tok, local, seed=1)
    assert cached["cached"] and cached["steps"] == steps and cached["accuracy"] == acc
    meta = json.loads((Path(cached["path"]).parent / "meta.json").read_text())
    assert meta["steps"] == steps
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_band_not_reached_within_max_steps_is_a_clear_error_and_nothing_is_cached(tmp_path):
    tok = build_tokenizer()
    local = _local(target_accuracy=(0.99, 1.0), eval_every=5, max_steps=10)
    with pytest.raises(
        WarmupError, match=r"max_steps passed below the band.*local\.warmup\.max_steps"
    ):
        warm_start(build_model(local.model, tok, seed=1), tok, local, seed=1)
    assert not list((tmp_path / "cache").rglob("model.safetensors"))


def test_accuracy_jumping_past_the_band_is_an_error_naming_eval_every():
    tok = build_tokenizer()
    # one check after 300 steps: far past a band that ends at 0.05
    local = _local(target_accuracy=(0.01, 0.05), eval_every=300, max_steps=300)
    with pytest.raises(WarmupError, match=r"jumped past the band.*local\.warmup\.eval_every"):
        warm_start(build_model(local.model, tok, seed=1), tok, local, seed=1)


def test_fixed_step_warmup_records_its_steps():
    tok = build_tokenizer()
    local = _local(steps=7)
    info = warm_start(build_model(local.model, tok, seed=1), tok, local, seed=1)
    assert info["steps"] == 7 and info["accuracy"] is None
    assert warmup_metrics(info) == {"warmup/steps": 7.0}


def test_cache_key_follows_every_warmup_setting():
    vocab = build_tokenizer().get_vocab()
    base = config_key(_local(target_accuracy=(0.2, 0.6)), 1, vocab)
    assert config_key(_local(target_accuracy=(0.2, 0.6)), 1, vocab) == base
    for change in (
        {"target_accuracy": (0.3, 0.6)},
        {"eval_every": 5},
        {"max_steps": 99},
        {"eval_size": 64},
        {"target_accuracy": None},
    ):
        assert config_key(_local(**{"target_accuracy": (0.2, 0.6), **change}), 1, vocab) != base
    assert config_key(_local(target_accuracy=(0.2, 0.6)), 2, vocab) != base


def test_cache_key_follows_the_numerics_and_the_shipped_key_does_not():
    """A computed warm-up is cached per thread count (and CPU kernels); a shipped one is found
    by its configuration alone, whatever the machine."""
    local, vocab = _local(steps=3), build_tokenizer().get_vocab()
    one = cache_key(local, 1, vocab)
    torch.set_num_threads(2)
    try:
        assert cache_key(local, 1, vocab) != one
        assert config_key(local, 1, vocab) == config_key(_local(steps=3), 1, vocab)
    finally:
        torch.set_num_threads(1)


def test_cache_key_holds_no_torch_version(monkeypatch):
    """The project's environment and NeMo RL's (another torch) share one cached warm-up."""
    local, vocab = _local(steps=3), build_tokenizer().get_vocab()
    one = cache_key(local, 1, vocab)
    monkeypatch.setattr(torch, "__version__", "0.0.1+other")
    assert cache_key(local, 1, vocab) == one


def test_the_key_holds_only_the_task_settings_the_warmup_reads():
    """The GRPO validation size and training seed do not change the warm-up; digits do."""
    vocab = build_tokenizer().get_vocab()
    base = config_key(_local(steps=3), 1, vocab)
    for task in ({"num_validation": 64}, {"train_seed": 9}):
        local = LocalConfig(**{**_SMALL, "task": {**_SMALL["task"], **task}},
                            warmup={"batch_size": 64, "lr": 3e-3, "steps": 3})  # fmt: skip
        assert config_key(local, 1, vocab) == base, task
    two = LocalConfig(model={"num_layers": 1}, task={"digits": 2},
                      warmup={"batch_size": 64, "lr": 3e-3, "steps": 3})  # fmt: skip
    assert config_key(two, 1, vocab) != base


@pytest.mark.parametrize(
    "recipe",
    sorted(
        str(p.relative_to(Path(__file__).parents[1] / "recipes").with_suffix(""))
        for folder in ("tiny", "tiny-nemo")
        for p in (Path(__file__).parents[1] / "recipes" / folder).glob("*.yaml")
    ),
)
def test_every_tiny_recipe_starts_from_a_shipped_warmup(recipe, monkeypatch):
    """No tiny recipe trains its warm-up on first use (it took ~25 min of a first tiny-nemo run)."""
    from nemo_fp8_rl.config import load_recipe
    from nemo_fp8_rl.tiny import warmup_store

    monkeypatch.delenv("NEMO_FP8_RL_WARMUPS")
    config = load_recipe(recipe).config
    local = LocalConfig(**config["local"])
    vocab = build_tokenizer().get_vocab()
    _, source = warmup_store.lookup(local, config["grpo"]["seed"], vocab)
    assert source == "shipped", recipe


def test_a_shipped_warmup_is_used_instead_of_training(tmp_path, monkeypatch):
    tok = build_tokenizer()
    local = _local(steps=5)
    first = build_model(local.model, tok, seed=3)
    built = warm_start(first, tok, local, seed=3)
    assert built["source"] == "computed"
    shipped = tmp_path / "shipped"
    monkeypatch.setenv("NEMO_FP8_RL_WARMUPS", str(shipped))
    (shipped / config_key(local, 3, tok.get_vocab())).mkdir(parents=True)
    folder = shipped / config_key(local, 3, tok.get_vocab())
    for name in ("model.safetensors", "meta.json"):
        (folder / name).write_bytes(Path(built["path"]).with_name(name).read_bytes())
    monkeypatch.setenv("NEMO_FP8_RL_CACHE", str(tmp_path / "empty-cache"))
    fresh = build_model(local.model, tok, seed=3)
    info = warm_start(fresh, tok, local, seed=3)
    assert info["source"] == "shipped" and info["steps"] == 5 and info["cached"]
    pairs = zip(fresh.state_dict().values(), first.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("band", [(0.0, 0.5), (0.6, 0.5), (0.2, 1.5)])
def test_bad_band_is_refused(band):
    with pytest.raises(ValidationError, match="target_accuracy"):
        WarmupConfig(target_accuracy=band)


def test_warmup_metrics_of_a_band_warmup():
    assert warmup_metrics({"steps": 120, "accuracy": 0.25}) == {
        "warmup/steps": 120.0,
        "warmup/accuracy": 0.25,
    }
    assert warmup_metrics(None) == {}
