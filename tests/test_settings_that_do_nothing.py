"""Settings accepted that would do nothing or the wrong thing are refused at load, each naming
the key and the range: 0 for `checkpointing.save_period` (a modulo by zero in NeMo RL),
`checkpointing.keep_top_k` (keeps no checkpoint), `policy.generation_batch_size`,
`policy.logprob_batch_size` and `env.math.num_workers` (nothing generated, scored or logged).
"""

from __future__ import annotations

import pytest

from nemo_fp8_rl.config import RecipeError, load_recipe

GPU = "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8"

ZEROS = [
    ("checkpointing.save_period", ">= 1 (set checkpointing.enabled: false"),
    ("checkpointing.keep_top_k", "0 would keep no checkpoint"),
    ("policy.generation_batch_size", ">= 1"),
    ("policy.logprob_batch_size", ">= 1"),
    ("env.math.num_workers", "the math verifier's workers"),
]


@pytest.mark.parametrize(("key", "says"), ZEROS)
def test_a_zero_that_does_nothing_is_refused(key, says):
    with pytest.raises(RecipeError) as err:
        load_recipe(GPU, [f"{key}=0"])
    text = str(err.value)
    assert key in text and says in text and "Fix:" in text


@pytest.mark.parametrize("override", ["checkpointing.keep_top_k=1", "checkpointing.save_period=1"])
def test_the_meaningful_values_stay_accepted(override):
    load_recipe(GPU, [override])
