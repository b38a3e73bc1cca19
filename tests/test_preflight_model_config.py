"""Where the preflight finds a model's config.json: the copies shipped for the recipes' models,
`policy.model_name` as a local folder, the Hugging Face cache laid out as `huggingface_hub`
writes it, or `$NEMO_FP8_RL_MODEL_CONFIGS`; and, when none holds it, an error that says where
it looked and how to provide one (not a path inside the installed package)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_fp8_rl.engines.nemo.preflight.offline_hub import NoLocalCopy, model_config

MODEL = "Qwen/Qwen2.5-1.5B"
CONFIG = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28}


@pytest.fixture
def no_user_copies(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache and no NEMO_FP8_RL_MODEL_CONFIGS."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("NEMO_FP8_RL_MODEL_CONFIGS", raising=False)
    return cache


def test_a_model_without_a_config_is_refused_with_the_ways_to_give_one(no_user_copies):
    with pytest.raises(NoLocalCopy) as caught:
        model_config(MODEL)
    err = caught.value
    assert err.key == "policy.model_name"
    assert f"not in the Hugging Face cache {no_user_copies}" in err.what
    assert f"huggingface-cli download {MODEL} config.json" in err.fix
    assert "a local folder holding config.json" in err.fix
    assert "NEMO_FP8_RL_MODEL_CONFIGS" in err.fix and "model_configs" not in err.fix


def test_the_hugging_face_cache_is_read_as_huggingface_hub_lays_it_out(no_user_copies):
    repo = no_user_copies / "models--Qwen--Qwen2.5-1.5B"
    old, new = repo / "snapshots" / ("a" * 40), repo / "snapshots" / ("b" * 40)
    for snap, layers in ((old, 1), (new, 28)):
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": layers}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    assert model_config(MODEL) == CONFIG  # refs/main's snapshot first


def test_a_local_folder_and_the_environment_folder(no_user_copies, tmp_path, monkeypatch):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    assert model_config(str(folder)) == CONFIG
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "Qwen--Qwen2.5-1.5B.json").write_text(json.dumps(CONFIG))
    monkeypatch.setenv("NEMO_FP8_RL_MODEL_CONFIGS", str(configs))
    assert model_config(MODEL) == CONFIG


def test_shipped_models_need_nothing(no_user_copies):
    assert model_config("Qwen/Qwen3-8B-Base")["model_type"] == "qwen3"
