"""Resuming NeMo RL's loop on CPU with another `grpo.max_num_steps` would rewrite the training
prompt file under the checkpoint's dataloader position: refused, located, with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.config import load_recipe
from nemo_fp8_rl.tiny import handover as tiny_handover
from nemo_fp8_rl.tiny.handover import ResumeDataError

RECIPE = "tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8"


def test_a_resume_that_would_resize_the_prompt_file_is_refused_and_leaves_it(tmp_path: Path):
    five = load_recipe(RECIPE, ["grpo.max_num_steps=5"])
    tiny_handover.prepare(five.config, tmp_path)
    train = tmp_path / tiny_handover.INPUTS / "train.jsonl"
    before = train.read_bytes()
    assert len(before.splitlines()) == 80
    ten = load_recipe(RECIPE)  # max_num_steps 10: 160 prompts
    with pytest.raises(ResumeDataError) as err:
        tiny_handover.prepare(ten.config, tmp_path, resume=True)
    message = str(err.value)
    assert "80 training prompts" in message and "160" in message, message
    assert "grpo.max_num_steps=5" in message and "--run-dir" in message, message
    assert train.read_bytes() == before


def test_a_resume_with_the_same_settings_and_a_new_run_go_ahead(tmp_path: Path):
    five = load_recipe(RECIPE, ["grpo.max_num_steps=5"])
    tiny_handover.prepare(five.config, tmp_path)
    tiny_handover.prepare(five.config, tmp_path, resume=True)
    tiny_handover.prepare(
        load_recipe(RECIPE).config, tmp_path
    )  # --overwrite / a fresh start rewrites
    train = tmp_path / tiny_handover.INPUTS / "train.jsonl"
    assert len(train.read_text().splitlines()) == 160
