"""Command lines the project prints for the user to paste, spelled as this process was started.

A `next:` line, a "train it with" line or a "more seeds" hint must run where it is pasted. The
console scripts (`nemo_fp8_rl.train`) exist only inside the project's environment: after
`uv run` (which sets `UV`) they need `uv run` again, and from outside the project folder
`uv run --project <root>` (uv finds the project from the working folder, so a bare `uv run`
elsewhere fails with "Failed to spawn"). In an activated environment the bare name works; where
no console script is installed it is `python -m nemo_fp8_rl.<command>`, behind
`bash scripts/nemo-rl-env.sh <tree> --` in the NeMo RL environment that script sets up.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def project_root() -> Path:
    """The checkout this package runs from (the folder holding pyproject.toml)."""
    return Path(__file__).resolve().parents[2]


def _in_project_venv() -> bool:
    return Path(sys.prefix).resolve() == (project_root() / ".venv").resolve()


def uv_prefix() -> str | None:
    """`uv run` (or `uv run --project <root>` outside the checkout) when this process was
    started by `uv run` in the project's environment; None otherwise."""
    if not (os.environ.get("UV") and _in_project_venv()):
        return None
    root = project_root()
    try:
        Path.cwd().resolve().relative_to(root.resolve())
    except ValueError:
        return f"uv run --project {shlex.quote(str(root))}"
    return "uv run"


def tool(name: str) -> str:
    """A program of the project's environment (`tensorboard`), as it runs from here."""
    prefix = uv_prefix()
    return f"{prefix} {name}" if prefix else name


def command(name: str) -> str:
    """The command line prefix that runs `nemo_fp8_rl.<name>` from the current folder."""
    script = f"nemo_fp8_rl.{name}"
    prefix = uv_prefix()
    if prefix:
        return f"{prefix} {script}"
    if shutil.which(script):
        return script
    nemo_env = nemo_rl_env_prefix()
    return f"{nemo_env} python -m {script}" if nemo_env else f"python -m {script}"


def nemo_rl_env_prefix() -> str | None:
    """`bash scripts/nemo-rl-env.sh [--vllm] <tree> --` when this process runs in the NeMo RL
    environment that script set up (it exports `NEMO_RL_SRC`, and `NEMO_FP8_RL_ENV_FLAGS` for
    `--vllm`): a bare `python -m` pasted in another shell would not find NeMo RL's environment."""
    tree = os.environ.get("NEMO_RL_SRC")
    if not tree:
        return None
    script = project_root() / "scripts" / "nemo-rl-env.sh"
    try:
        shown = script.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = script
    flags = os.environ.get("NEMO_FP8_RL_ENV_FLAGS", "").split()
    return shlex.join(["bash", str(shown), *flags, tree, "--"])
