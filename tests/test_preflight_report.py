"""The preflight's reporting on any machine (no NeMo RL): traceback -> key path + file:line.

A real module under a `nemo_rl/` folder raises the errors, so `locate` reads real tracebacks.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from nemo_fp8_rl.cli import submit as submit_cli
from nemo_fp8_rl.cli import train as train_cli
from nemo_fp8_rl.cli.common import invoke
from nemo_fp8_rl.engines.nemo.preflight.located import (
    LocatedError,
    innermost_in,
    locate,
    render_report,
    with_default_fix,
)

READER = """
def read(master):
    policy_config = master["policy"]
    gen = policy_config["generation"]
    return gen["vllm_cfg"]["enforce_eager"]

def read_copy(master):
    import copy
    cfg = copy.deepcopy(master["data"])
    return cfg["use_multiple_dataloader"]

def check(master):
    assert master["grpo"]["seed"] > 0, "seed must be positive"

class Fp8Config:
    use_activation_pow2_scale = True

def patches(master):
    found = []
    config = Fp8Config()
    if config.use_activation_pow2_scale:
        found.append("a", "b", "c")
    return found
"""


@pytest.fixture()
def reader(tmp_path):
    folder = tmp_path / "nemo_rl" / "algorithms"
    folder.mkdir(parents=True)
    (folder / "reader.py").write_text(READER)
    spec = importlib.util.spec_from_file_location("nemo_rl_reader_t", folder / "reader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("nemo_rl_reader_t", None)


def _config() -> dict:
    return {
        "policy": {"generation": {"vllm_cfg": {}}},
        "data": {"shuffle": True},
        "grpo": {"seed": 0},
    }


def _raise(fn, master):
    with pytest.raises(Exception) as info:
        fn(master)
    return info.value


def test_key_error_gives_key_path_and_line(reader) -> None:
    master = _config()
    err = locate(_raise(reader.read, master), master)
    assert err.key == "policy.generation.vllm_cfg.enforce_eager"
    assert err.file == "nemo_rl/algorithms/reader.py" and err.line == 5
    assert "enforce_eager" in err.fix


def test_key_error_on_a_copy_is_found_by_equality(reader) -> None:
    master = _config()
    err = locate(_raise(reader.read_copy, master), master)
    assert err.key == "data.use_multiple_dataloader" and err.line == 10


def test_other_errors_name_the_failing_line(reader) -> None:
    """A failing check is located at its line; the config key its statement reads is named."""
    master = _config()
    err = locate(_raise(reader.check, master), master)
    assert err.line == 13 and "seed must be positive" in err.message
    assert err.key == "grpo.seed" and "`grpo.seed`" in err.fix
    assert locate(_raise(reader.check, master), {}).key is None  # no config to find it in


def test_nemo_rls_own_bug_is_reported_as_nemo_rls_with_the_key_that_leads_there(reader) -> None:
    """v0.7.0's fp8.py calls `vllm_patches.append(p2, p3, p4)` when pow2 activation scales are
    on: a TypeError of NeMo RL's code, reached with `pow2_activation_scaling_factors: true`."""
    master = {
        "policy": {
            "generation": {
                "vllm_cfg": {
                    "pow2_weight_scaling_factors": True,
                    "pow2_activation_scaling_factors": True,
                }
            }
        }
    }
    err = locate(_raise(reader.patches, master), master)
    assert err.line == 22 and err.file == "nemo_rl/algorithms/reader.py"
    assert err.message.startswith("NeMo RL's own bug, not the recipe's (TypeError: ")
    assert err.key == "policy.generation.vllm_cfg.pow2_activation_scaling_factors"
    assert "reached with `policy.generation.vllm_cfg.pow2_activation_scaling_factors: true`" in (
        err.message
    )
    assert err.fix.startswith("use a NeMo RL tree where this line is fixed")
    assert "so that NeMo RL's" not in err.fix  # not a recipe problem with a recipe fix


def test_errors_outside_nemo_rl_are_not_located() -> None:
    try:
        {}["x"]
    except KeyError as exc:
        assert locate(exc, {}) is None


def test_library_refusals_are_located_at_the_innermost_library_frame(tmp_path) -> None:
    """megatron-core's and vLLM's own checks: the deepest frame under the library's folder."""
    folder = tmp_path / "megatron" / "core" / "transformer"
    folder.mkdir(parents=True)
    (folder / "cfg.py").write_text(
        "def outer(check):\n    return inner(check)\n\ndef inner(check):\n    return check()\n"
    )
    spec = importlib.util.spec_from_file_location("megatron_cfg_t", folder / "cfg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def refuse():  # a frame outside the library, below its frames
        raise ValueError("tensor_model_parallel_size must divide heads")

    exc = _raise(module.outer, refuse)
    assert innermost_in(exc, "megatron/core") == ("megatron/core/transformer/cfg.py", 5)
    assert innermost_in(exc, "vllm") == ("vllm", 0)


def test_report_lists_every_problem_with_fix() -> None:
    a = LocatedError("data.x", "nemo_rl/a.py", 3, "missing", "add it")
    b = with_default_fix(
        LocatedError("policy.y", "nemo_rl/b.py", 9, "missing", "add"), 0, "ex.yaml"
    )
    text = render_report("r", [a, b])
    assert "2 problem(s)" in text and "nemo_rl/a.py:3" in text and "nemo_rl/b.py:9" in text
    assert "`policy.y: 0` (NeMo RL's value in ex.yaml)" in text


nemo_missing = pytest.mark.skipif(
    importlib.util.find_spec("nemo_rl") is not None, reason="NeMo RL is importable here"
)


@nemo_missing
def test_train_preflight_without_nemo_rl_says_why(capsys) -> None:
    argv = ["--recipe", "qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8", "--preflight"]
    assert invoke(train_cli.main, argv) == 3
    assert capsys.readouterr().err.startswith("error: --preflight: NeMo RL is not usable here")


@nemo_missing
def test_submit_gate_skips_and_says_so(capsys) -> None:
    from nemo_fp8_rl.config import load_recipe

    recipe = load_recipe("qwen3-8b-base/grpo-qwen3-8b-base-1n8g-fp8")
    assert submit_cli.preflight_gate(recipe, skip=False) is None
    assert "preflight skipped: NeMo RL is not importable" in capsys.readouterr().err
    assert submit_cli.preflight_gate(recipe, skip=True) is None
    assert "--no-preflight" in capsys.readouterr().err


SETUP_SRC = """
def setup_model_config(config, hf_config):
    megatron_cfg = config["megatron_cfg"]
    model_cfg.fp8 = megatron_cfg["fp8_cfg"]["fp8"]
    if "layernorm_epsilon" in config["megatron_cfg"]:
        model_cfg.eps = config["megatron_cfg"]["layernorm_epsilon"]
    model_cfg.relu = config["megatron_cfg"]["use_fused_weighted_squared_relu"]
    return megatron_cfg.get("moe_router_dtype")

def other(self):
    cfg = dict(self.cfg["generation"])
    return cfg["vllm_cfg"]["precision"], hf_config["not_a_policy_key"]
"""


def test_bracket_reads_follow_aliases_and_skip_guarded_reads(tmp_path) -> None:
    from nemo_fp8_rl.engines.nemo.preflight.config_reads import bracket_reads

    (tmp_path / "nemo_rl").mkdir()
    (tmp_path / "nemo_rl" / "setup.py").write_text(SETUP_SRC)
    reads = {(r.key, r.line) for r in bracket_reads(tmp_path, "nemo_rl/setup.py")}
    assert ("policy.megatron_cfg.fp8_cfg.fp8", 4) in reads
    assert ("policy.megatron_cfg.use_fused_weighted_squared_relu", 7) in reads
    assert ("policy.generation.vllm_cfg.precision", 12) in reads
    keys = {k for k, _ in reads}
    assert "policy.megatron_cfg.layernorm_epsilon" not in keys  # guarded by `in`
    assert "policy.megatron_cfg.moe_router_dtype" not in keys  # .get() read
    assert not any("not_a_policy_key" in k for k in keys)
