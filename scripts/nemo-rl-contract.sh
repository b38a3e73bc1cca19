#!/usr/bin/env bash
# Contract tests against a NeMo RL source tree, on CPU.
#
#   scripts/nemo-rl-contract.sh /path/to/nemo-rl [extra pytest args]
#
# Builds (once) the NeMo RL environment (scripts/nemo-rl-env.sh: a Python 3.12 virtual environment
# with the packages NeMo RL's import chain needs), puts this checkout and the NeMo RL tree first on
# PYTHONPATH, then runs the engine's tests
# (tests/test_nemo_*.py) there with NEMO_RL_SRC set, so the `nemo_rl`-marked contract tests run
# and the other engine tests use NeMo RL's own BatchedDataDict and loss enums.
#
# Environment: NEMO_RL_ENV  where to build the environment (default ~/.cache/nemo-fp8-rl/nemo-rl-env)
#              PYTHON312    a Python >= 3.12 interpreter (default: the first that runs of python3.12,
#                           python3.13, python3 on PATH, pyenv's installed 3.12+, uv's)
set -euo pipefail

if [[ $# -lt 1 || ! -d "$1/nemo_rl" ]]; then
  echo "usage: $0 /path/to/nemo-rl [pytest args]   (a NeMo RL source tree: it must hold nemo_rl/)" >&2
  exit 2
fi
SRC=$(cd "$1" && pwd)
shift
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

bash "$REPO/scripts/nemo-rl-env.sh" "$SRC" >/dev/null
ENV_DIR=${NEMO_RL_ENV:-$HOME/.cache/nemo-fp8-rl/nemo-rl-env}
echo "NeMo RL tree: $SRC ($(git -C "$SRC" describe --tags --always 2>/dev/null || echo 'not a git checkout'))"
cd "$REPO"
NEMO_RL_SRC="$SRC" PYTHONPATH="$REPO:$SRC${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
  "$ENV_DIR/bin/python" -m pytest -p no:cacheprovider -rs tests/test_nemo_*.py "$@"
