"""Exact vocabularies: a GPU type is one of a closed list, matched whole (a near miss is refused
with the nearest name, never taken by substring), and a model's config.json is checked for
sense before any estimate is made from it.
"""

from __future__ import annotations

import json

import pytest

from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.config.gpus import find_gpu, gpu_in_words
from nemo_fp8_rl.guards.model_shapes import shape_problems
from nemo_fp8_rl.guards.worker_gpu import parse_sinfo

GPU_RECIPE = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"

# (what the user typed, the nearest name the refusal offers, or None for the list alone)
NEAR_MISSES = [
    ("H100x", "H100"),
    ("B2000", "B200"),
    ("GH200", "H200"),
    ("a100-40gb", "A100"),
    ("h10", "H100"),
    ("", None),
    ("   ", None),
    ("quantum", None),
]


@pytest.mark.parametrize(("typed", "nearest"), NEAR_MISSES)
def test_a_gpu_near_miss_is_refused_with_the_nearest_name(typed, nearest, capsys):
    code = invoke(train_cli.main, ["--recipe", GPU_RECIPE, "--gpu", typed, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "--gpu" in err and "Traceback" not in err, err
    assert (f"did you mean {nearest}?" in err) if nearest else ("H100, H200" in err), err
    assert find_gpu(typed) is None


@pytest.mark.parametrize(
    ("typed", "name"),
    [("H100", "H100"), ("h100-80gb", "H100"), ("NVIDIA H200", "H200"), ("gb200", "GB200"),
     ("B200", "B200"), ("a100-80gb", "A100")],
)  # fmt: skip
def test_every_spelling_of_the_list_is_taken(typed, name):
    assert find_gpu(typed).name == name


@pytest.mark.parametrize(
    ("word", "name"),
    [("h100", "H100"), ("nvidia_h100_80gb_hbm3", "H100"), ("gpu-a100-80gb", "A100"),
     ("gb200", "GB200"), ("gh200", None), ("a100-40gb", None), ("h100x", None)],
)  # fmt: skip
def test_slurm_gres_and_features_name_a_type_by_whole_words(word, name):
    found = gpu_in_words(word)
    assert (found.name if found else None) == name
    assert parse_sinfo(f"gpu:{word}:8|(null)\n") == ({name} if name else set())


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"num_hidden_layers": -3}, "num_hidden_layers is -3"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0"),
        ({"hidden_size": 4096.5}, "hidden_size is 4096.5"),
        ({"num_key_value_heads": 5}, "does not divide"),
        ({"vocab_size": True}, "vocab_size is True"),
    ],
)
def test_impossible_model_shapes_are_named(change, says, tmp_path, capsys):
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import MODEL_CONFIGS, model_config

    hf = json.loads(next(MODEL_CONFIGS.glob("Qwen--Qwen3-8B*.json")).read_text())
    assert shape_problems(hf) == []
    (tmp_path / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(Exception, match="impossible model shapes") as err:
        model_config(str(tmp_path))
    assert says in str(err.value) and "Fix:" in str(err.value)


def test_a_garbled_model_config_is_a_located_error(tmp_path):
    from nemo_fp8_rl.config.user_error import UsageError
    from nemo_fp8_rl.engines.nemo.driver.guard_rails import model_config

    (tmp_path / "config.json").write_text("{garbled")
    with pytest.raises(UsageError, match="not JSON"):
        model_config(str(tmp_path))
