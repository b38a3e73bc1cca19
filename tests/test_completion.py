"""`nemo_fp8_rl completion bash`, exercised in a real bash: the generated function is sourced
and called with COMP_WORDS as bash sets them on <TAB>."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nemo_fp8_rl.cli import completion

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("completion") / "nemo_fp8_rl.bash"
    path.write_text(completion.bash_script())
    return str(path)


def complete(script: str, *words: str) -> list[str]:
    """What bash offers for the command line `words` (the last word is being completed)."""
    array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        'cd /nonexistent 2>/dev/null; _nemo_fp8_rl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def test_commands_flags_and_recipes_complete(script: str) -> None:
    assert {"train", "recipes", "compare"} <= set(complete(script, "nemo_fp8_rl", ""))
    assert complete(script, "nemo_fp8_rl", "tr") == ["train"]
    assert "--recipe" in complete(script, "nemo_fp8_rl.train", "--re")
    assert "--seeds" in complete(script, "nemo_fp8_rl", "train", "--se")
    offered = complete(script, "nemo_fp8_rl.train", "--recipe", "tiny/grpo-tiny-qwen3-cpu-f")
    assert "tiny/grpo-tiny-qwen3-cpu-fp8" in offered
    assert "tiny/grpo-tiny-qwen3-cpu-fp8" in complete(
        script, "nemo_fp8_rl.recipes", "show", "tiny/"
    )


def test_flags_are_read_from_each_commands_help() -> None:
    assert "--checkpoint" in completion.command_flags("eval")
    assert "--no-plots" in completion.command_flags("compare")


def test_a_recipe_file_name_is_never_run(tmp_path, monkeypatch) -> None:
    """A recipe pack holding `$(touch pwned).yaml`: pressing TAB after --recipe offers the name
    as it is and runs nothing (`compgen -W` used to expand it, running `touch`)."""
    import shutil as sh

    from nemo_fp8_rl.config import project_root

    home = tmp_path / "project"
    for name in ("recipes", "configs"):
        sh.copytree(project_root() / name, home / name)
    evil = home / "recipes" / "evil"
    evil.mkdir()
    (evil / "$(touch pwned).yaml").write_text("defaults: tiny/grpo-tiny-qwen3-cpu-bf16\n")
    (evil / "`touch pwned2`.yaml").write_text("defaults: tiny/grpo-tiny-qwen3-cpu-bf16\n")
    monkeypatch.setenv("NEMO_FP8_RL_HOME", str(home))
    script = tmp_path / "nemo_fp8_rl.bash"
    script.write_text(completion.bash_script())
    here = tmp_path / "here"
    here.mkdir()
    program = (
        f"source {script}; COMP_WORDS=(nemo_fp8_rl.train --recipe evil/); COMP_CWORD=2; "
        '_nemo_fp8_rl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, check=True, cwd=here
    )
    assert out.stdout.splitlines() == ["evil/$(touch pwned)", "evil/`touch pwned2`"]
    assert list(here.iterdir()) == [] and not (tmp_path / "pwned").exists()
