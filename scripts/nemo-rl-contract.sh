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
# Environment: NEMO_RL_ENV and PYTHON312, as for scripts/nemo-rl-env.sh.
set -euo pipefail
# shellcheck source=scripts/nemo-rl-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"  # REPO, ENV_DIR, nemo_rl_tree
nemo_rl_tree "[pytest args]" "$@"
shift

bash "$REPO/scripts/nemo-rl-env.sh" "$SRC" >/dev/null
echo "NeMo RL tree: $SRC ($(git -C "$SRC" describe --tags --always 2>/dev/null || echo 'not a git checkout'))"
cd "$REPO"
NEMO_RL_SRC="$SRC" PYTHONPATH="$REPO:$SRC${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
  "$ENV_DIR/bin/python" -m pytest -p no:cacheprovider -rs tests/test_nemo_*.py "$@"
