#!/usr/bin/env bash
# The NeMo RL environment on CPU: a Python 3.12 virtual environment with the packages NeMo RL's
# import chain needs; commands run in it with NeMo RL's source tree and this checkout on the path.
#
#   scripts/nemo-rl-env.sh /path/to/nemo-rl            # build (once) and print how to use it
#   scripts/nemo-rl-env.sh /path/to/nemo-rl -- CMD...  # build, then run CMD inside it
#
# NeMo RL is not installed from a registry (it is not on PyPI): with `--`, PYTHONPATH holds this
# checkout and the NeMo RL tree, so `python -m nemo_fp8_rl.train --engine nemo` and NeMo RL's Ray
# actors (which inherit the environment) import both.
#
# Environment: NEMO_RL_ENV  where to build it (default ~/.cache/nemo-fp8-rl/nemo-rl-env)
#              PYTHON312    a Python >= 3.12 interpreter (default: the first that runs of python3.12,
#                           python3.13, python3 on PATH, pyenv's installed 3.12+, uv's)
set -euo pipefail
# shellcheck source=scripts/nemo-rl-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"  # REPO, ENV_DIR, nemo_rl_tree
nemo_rl_tree "[-- command ...]" "$@"
shift

runs() {  # runs PYTHON: true when it starts and is >= 3.12 (a pyenv shim may exist yet not run)
  [[ -n "$1" ]] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1
}

find_python() {
  if [[ -n "${PYTHON312:-}" ]]; then
    if runs "$PYTHON312"; then echo "$PYTHON312"; return; fi
    echo "PYTHON312=$PYTHON312 does not run as Python >= 3.12: point it at a working interpreter" >&2
    exit 2
  fi
  local p candidates=()
  for name in python3.12 python3.13 python3; do
    p=$(command -v "$name" 2>/dev/null) && candidates+=("$p")
  done
  if command -v pyenv >/dev/null; then
    # pyenv's own interpreters, not its shims (a shim runs only when that version is selected)
    while IFS= read -r p; do candidates+=("$p"); done < <(
      ls -d "$(pyenv root)"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V)
  fi
  p=$(uv python find '>=3.12' 2>/dev/null) && candidates+=("$p")
  for p in "${candidates[@]}"; do
    if runs "$p"; then echo "$p"; return; fi
  done
  echo "no working Python >= 3.12 found (tried: ${candidates[*]:-none}): set PYTHON312=/path/to/python3.12" \
    "(NeMo RL's config classes need >= 3.12)" >&2
  exit 2
}

if ! runs "$ENV_DIR/bin/python"; then
  PY=$(find_python)
  echo "building the NeMo RL environment $ENV_DIR with $PY" >&2
  uv venv --clear --python "$PY" "$ENV_DIR" >&2
fi
# NeMo RL's import chain on CPU (reference: importing NeMo RL on a CPU-only machine), plus what
# this package and its tests import. transformers < 5.12: NeMo RL asserts it at import time.
VIRTUAL_ENV="$ENV_DIR" uv pip install --quiet \
  torch pydantic requests pillow "transformers<5.12" ray pyzmq nvidia-ml-py uvicorn fastapi \
  mlflow swanlab wandb prometheus_client tensorboard hydra-core torchdata datasets soundfile \
  tensordict pyyaml numpy safetensors matplotlib rich "megatron-core==0.19.2" pytest hypothesis \
  math-verify "accelerate>=0.26" coverage

if [[ "${1:-}" == "--" ]]; then
  shift
  # this checkout and the NeMo RL tree first on the path (Ray passes it to every actor)
  export PATH="$ENV_DIR/bin:$PATH" VIRTUAL_ENV="$ENV_DIR" NEMO_RL_SRC="$SRC"
  export PYTHONPATH="$REPO:$SRC${PYTHONPATH:+:$PYTHONPATH}"
  exec "$@"
fi
echo "NeMo RL environment: $ENV_DIR; run a command in it with NeMo RL's tree ($SRC) and this"
echo "checkout on the path:  $0 $SRC -- python -m nemo_fp8_rl.train --recipe tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8 --engine nemo"
