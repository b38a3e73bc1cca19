"""Which generation worker NeMo RL's loop on CPU runs: real vLLM where it can, else the stand-in,
with a line saying why (`engines.nemo.cpu.vllm_choice`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_fp8_rl.engines.nemo.cpu import vllm_choice
from nemo_fp8_rl.engines.nemo.cpu.vllm_choice import (
    GenerationChoiceError,
    blocker,
    choose,
    cpu_flags,
)


def _config(precision: str) -> dict:
    return {"policy": {"generation": {"vllm_cfg": {"precision": precision}}}}


AMX = {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse amx_tile amx_bf16\nbugs\t: none\n")
    assert cpu_flags(info) == {"fpu", "sse", "amx_tile", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_block_fp8_needs_amx_and_bf16_does_not() -> None:
    assert blocker(_config("fp8"), AMX, "0.25.1") is None
    why = blocker(_config("fp8"), {"avx512f"}, "0.25.1")
    assert why is not None and "AMX" in why and "amx_tile" in why
    assert blocker(_config("bfloat16"), {"avx512f"}, "0.25.1") is None


def test_mxfp8_stays_on_the_stand_in_even_with_amx(monkeypatch) -> None:
    """vLLM's CPU build has no MXFP8 kernel: an is_mx recipe falls back to the stand-in, and
    forcing real vLLM is an error naming why."""
    mx = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8", "is_mx": True}}}}
    why = blocker(mx, AMX, "0.32.0")
    assert why is not None and "MXFP8" in why and "CPU platform" in why
    monkeypatch.setattr(vllm_choice, "vllm_version", lambda: "0.32.0")
    monkeypatch.delenv(vllm_choice.VARIABLE, raising=False)
    choice = choose(mx, flags=AMX)
    assert not choice.real_vllm and "MXFP8" in choice.reason
    monkeypatch.setenv(vllm_choice.VARIABLE, "vllm")
    with pytest.raises(GenerationChoiceError, match="MXFP8"):
        choose(mx, flags=AMX)


def test_the_async_engine_falls_back_to_the_stand_in() -> None:
    cfg = _config("fp8")
    cfg["policy"]["generation"]["vllm_cfg"]["async_engine"] = True
    why = blocker(cfg, AMX, "0.25.1")
    assert why is not None and "async engine" in why and "nccl" in why


def test_no_vllm_installed_names_the_script_that_builds_it() -> None:
    why = blocker(_config("bfloat16"), AMX, None)
    assert why is not None and "scripts/nemo-rl-env.sh --vllm" in why


def test_choice_falls_back_with_the_reason_and_can_be_forced(monkeypatch) -> None:
    monkeypatch.setattr(vllm_choice, "vllm_version", lambda: "0.25.1")
    monkeypatch.delenv(vllm_choice.VARIABLE, raising=False)
    default = choose(_config("fp8"), AMX)  # real vLLM wherever it can run
    assert default.real_vllm and "vLLM 0.25.1 (CPU build)" in default.reason
    assert choose(_config("bfloat16"), {"avx2"}).real_vllm  # BF16 needs no AMX
    fallback = choose(_config("fp8"), {"avx2"})
    assert not fallback.real_vllm and "needs AMX" in fallback.reason
    assert fallback.reason.startswith("the stand-in generation worker: ")
    monkeypatch.setattr(vllm_choice, "vllm_version", lambda: None)
    missing = choose(_config("fp8"), AMX)
    assert not missing.real_vllm and "not installed" in missing.reason
    monkeypatch.setattr(vllm_choice, "vllm_version", lambda: "0.25.1")
    monkeypatch.setenv(vllm_choice.VARIABLE, "vllm")
    assert choose(_config("fp8"), AMX).real_vllm
    monkeypatch.setenv(vllm_choice.VARIABLE, "stand-in")
    assert not choose(_config("fp8"), AMX).real_vllm
    monkeypatch.setenv(vllm_choice.VARIABLE, "vllm")
    with pytest.raises(GenerationChoiceError, match="needs AMX"):
        choose(_config("fp8"), {"avx2"})
    monkeypatch.setenv(vllm_choice.VARIABLE, "gpu")
    with pytest.raises(GenerationChoiceError, match="not a choice"):
        choose(_config("fp8"), AMX)


def test_the_installed_vllm_is_seen_as_installed() -> None:
    """This environment's answer agrees with whether `vllm` imports here."""
    import importlib.util

    assert (vllm_choice.vllm_version() is None) == (importlib.util.find_spec("vllm") is None)


def test_fused_parts_that_are_not_whole_fp8_blocks_are_named() -> None:
    """The tiny Qwen3 (q 128, k/v 64 wide, MLP 384): q/k/v stay BF16 for vLLM; a model with 8
    KV heads of 128 keeps every layer in FP8."""
    from nemo_fp8_rl.engines.nemo.cpu.fp8_block_fit import misfit_keywords

    tiny = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "hidden_size": 128, "intermediate_size": 384}  # fmt: skip
    assert misfit_keywords(tiny) == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    real = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
            "intermediate_size": 12288}  # fmt: skip
    assert misfit_keywords(real) == []
    assert "mlp.gate_proj" in misfit_keywords({**real, "intermediate_size": 320})


def test_forced_real_vllm_where_it_cannot_run_says_the_automatic_choice_s_reason(
    monkeypatch, capsys
) -> None:
    """`NEMO_FP8_RL_CPU_GENERATION=vllm` on a CPU without AMX: the command ends with one located
    error line (exit 1) carrying the reason the automatic choice prints, not an internal error."""
    from nemo_fp8_rl.cli.common import invoke

    monkeypatch.setattr(vllm_choice, "vllm_version", lambda: "0.25.1")
    monkeypatch.delenv(vllm_choice.VARIABLE, raising=False)
    automatic = choose(_config("fp8"), {"avx2"}).reason.removeprefix(
        "the stand-in generation worker: "
    )
    monkeypatch.setenv(vllm_choice.VARIABLE, "vllm")

    def main(argv: list[str]) -> int:
        choose(_config("fp8"), {"avx2"})
        return 0

    assert invoke(main, [], prog="nemo_fp8_rl.train") == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {vllm_choice.VARIABLE}=vllm: ") and automatic in line
    assert "internal error" not in line
