"""Every `next:` command a finished run prints runs where it is printed: the summary's lines,
spelled as the run was started (`uv run` in the checkout, `uv run --project <root>` from another
folder), are run in that folder, in a shell without the run's environment, with `--help` (so that
the program, its environment and its arguments' parser are reached, and nothing is trained)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from nemo_fp8_rl.config.commands import nemo_rl_env_prefix, project_root

ROOT = project_root()
PRINT = (
    "import sys; from pathlib import Path; from nemo_fp8_rl.runs.summary import next_lines; "
    "print('\\n'.join(next_lines(Path(sys.argv[1]))))"
)


def _run_dir(folder: Path) -> Path:
    run = folder / "runs" / "mine"
    (run / "logs" / "tb").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward": 0.5}) + "\n")
    return run


def _shell_env() -> dict[str, str]:
    """The user's shell: none of `uv run`'s variables, no activated environment."""
    drop = ("UV", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "NEMO_RL_SRC", "NEMO_FP8_RL_ENV_FLAGS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT / ".venv"))
    )
    return env


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_printed_next_commands_run_where_they_are_printed(tmp_path, where):
    folder = ROOT if where == "checkout" else tmp_path
    run = _run_dir(tmp_path)
    start = ["uv", "run", "--project", str(ROOT), "python", "-c", PRINT, str(run)]
    if where == "checkout":
        start = ["uv", "run", "python", "-c", PRINT, str(run)]
    printed = subprocess.run(
        start, cwd=folder, capture_output=True, text=True, timeout=600, env=_shell_env()
    )
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.split("next:\n", 1)[1].splitlines()
    commands = [line.split("  #")[0].strip() for line in lines if line.strip()]
    assert len(commands) == 3, commands  # eval, compare, tensorboard
    for line in commands:
        argv = [w if "<" not in w else str(run) for w in shlex.split(line)]  # a placeholder run
        done = subprocess.run(
            [*argv, "--help"], cwd=folder, capture_output=True, text=True, timeout=600,
            env=_shell_env(),
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr[-2000:])


def test_in_nemo_rls_environment_the_next_commands_go_through_its_script(monkeypatch, tmp_path):
    """In the environment `scripts/nemo-rl-env.sh` sets up, a bare `python -m` pasted elsewhere
    would miss NeMo RL: the printed command goes through the script, with its `--vllm`."""
    from nemo_fp8_rl.config.commands import command

    monkeypatch.delenv("UV", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no console script there
    monkeypatch.setenv("NEMO_RL_SRC", "/src/nemo-rl")
    monkeypatch.setenv("NEMO_FP8_RL_ENV_FLAGS", "--vllm")
    monkeypatch.chdir(ROOT)
    assert nemo_rl_env_prefix() == "bash scripts/nemo-rl-env.sh --vllm /src/nemo-rl --"
    assert (
        command("eval")
        == "bash scripts/nemo-rl-env.sh --vllm /src/nemo-rl -- python -m nemo_fp8_rl.eval"
    )
    monkeypatch.chdir(tmp_path)
    assert command("eval").startswith(f"bash {ROOT / 'scripts' / 'nemo-rl-env.sh'} --vllm")
