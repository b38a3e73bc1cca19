#!/usr/bin/env bash
# Contract tests against a NeMo RL source tree, on CPU.
#
#   scripts/nemo-rl-contract.sh [--vllm] /path/to/nemo-rl [extra pytest args]
#
# --vllm: in the NeMo RL environment with vLLM's CPU build at the tree's vLLM pin, where NeMo
# RL's loop on CPU generates with NeMo RL's own vLLM worker (tests/test_nemo_cpu_vllm_worker.py
# runs there; the stand-in generation worker's tests skip, vLLM being installed).
#
# Builds (once) the NeMo RL environment (scripts/nemo-rl-env.sh: a Python 3.13 virtual environment
# synced to a committed lock at NeMo RL's pins), puts this checkout and the NeMo RL tree first on
# PYTHONPATH, then runs the engine's tests
# (tests/test_nemo_*.py) there with NEMO_RL_SRC set, so the `nemo_rl`-marked contract tests run
# and the other engine tests use NeMo RL's own BatchedDataDict and loss enums.
#
# Environment: NEMO_RL_ENV, NEMO_RL_VLLM_ENV, PYTHON313: as scripts/nemo-rl-env.sh reads them
set -euo pipefail

VLLM=()
if [[ "${1:-}" == "--vllm" ]]; then VLLM=(--vllm); shift; fi
# shellcheck source=scripts/nemo-rl-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"  # REPO, ENV_DIR, nemo_rl_tree
nemo_rl_tree "[pytest args]   ([--vllm] first for the environment with vLLM)" "$@"
shift

echo "NeMo RL tree: $SRC ($(git -C "$SRC" describe --tags --always 2>/dev/null || echo 'not a git checkout'))"
cd "$REPO"
bash "$REPO/scripts/nemo-rl-env.sh" "${VLLM[@]}" "$SRC" -- env OMP_NUM_THREADS=1 \
  python -m pytest -p no:cacheprovider -rs tests/test_nemo_*.py "$@"
