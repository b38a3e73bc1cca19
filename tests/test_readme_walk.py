"""The README's first-hour block, walked as written (slow: two 150-step CPU trainings).

Each line of the block runs as it stands, one after another, in a copy of the checkout (its
tracked files, `git archive`) with the checkout's environment (`UV_PROJECT_ENVIRONMENT`), so the
runs, the copy and the export land in the copy, not in the checkout. The NeMo RL lines run
against the vendored v0.7.0 tree, unpacked as the README's offline route says, in place of the
`git clone` line; they are skipped, with the reason, where NeMo RL's environment cannot be built
here (no Python 3.13, or its packages cannot be installed). Every `next:` command a run prints is
then run where it was printed, with `--help`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT.parent / "shared" / "vendor" / "nemo-rl-v0.7.0.tar.gz"
README = (ROOT / "README.md").read_text(encoding="utf-8")
NEMO_RL_ENV = Path(
    os.environ.get("NEMO_RL_ENV", Path.home() / ".cache" / "nemo-fp8-rl" / "nemo-rl-env")
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("uv") is None or shutil.which("git") is None, reason="needs uv and git"
    ),
]


def first_hour_lines() -> list[str]:
    """The block's command lines, continuations joined, comments dropped."""
    block = re.search(r"## The first hour.*?```bash\n(.*?)```", README, re.DOTALL).group(1)
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def _run(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=7200
    )


def _next_commands(output: str) -> list[str]:
    tail = output.split("\nnext:\n", 1)
    if len(tail) < 2:
        return []
    lines = []
    for line in tail[1].splitlines():
        if not line.startswith("  "):
            break
        lines.append(line.split("  #")[0].strip())
    return lines


def _nemo_rl_env_buildable() -> str | None:
    """Why NeMo RL's environment cannot be built here (None: it can be tried)."""
    if not VENDOR.is_file():
        return f"the vendored NeMo RL tree {VENDOR} is not here"
    found = subprocess.run(["uv", "python", "find", "--no-config", "3.13"], capture_output=True)
    if found.returncode != 0 and shutil.which("python3.13") is None:
        return "no Python 3.13 here (NeMo RL's environment needs it)"
    return None


def test_the_first_hour_block_runs_as_written(tmp_path):
    checkout = tmp_path / "nemo-fp8-rl"
    checkout.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("UV", "VIRTUAL_ENV")}
    env["UV_PROJECT_ENVIRONMENT"] = str(ROOT / ".venv")
    skipped: list[str] = []
    why_not = _nemo_rl_env_buildable()
    for line in first_hour_lines():
        if line.startswith("git clone"):  # the offline route of the README, to the same tree
            if why_not is None:
                with tarfile.open(VENDOR) as tar:
                    tar.extractall(tmp_path, filter="data")  # unpacks to nemo-rl/
            continue
        nemo_line = line.startswith("bash scripts/nemo-rl-env.sh") or "nemo-cpu" in line
        if nemo_line and why_not is not None:
            skipped.append(f"{line}: {why_not}")
            continue
        done = _run(line, checkout, env)
        built = (NEMO_RL_ENV / "nemo-fp8-rl-lock.sha256").is_file()  # the script's stamp
        if line.startswith("bash scripts/nemo-rl-env.sh") and done.returncode != 0 and not built:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            why_not = f"NeMo RL's environment could not be built here: {last}"
            skipped.append(f"{line}: {why_not}")
            continue
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
        for command in _next_commands(done.stdout):
            argv = [w if "<" not in w else "runs/my-fp8" for w in shlex.split(command)]
            helped = subprocess.run(
                [*argv, "--help"],
                cwd=checkout,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert helped.returncode == 0, (line, command, helped.stderr[-2000:])
    assert (checkout / "runs" / "my-fp8" / "metrics.jsonl").is_file()
    assert (checkout / "my-fp8-vllm" / "config.json").is_file()
    if skipped:
        pytest.skip("walked the block; skipped: " + "; ".join(skipped))
