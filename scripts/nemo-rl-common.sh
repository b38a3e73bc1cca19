# shellcheck shell=bash
# The preamble of scripts/nemo-rl-env.sh, nemo-rl-contract.sh and nemo-rl-coverage.sh (sourced):
# this checkout, where the NeMo RL environment lives, and the NeMo RL source tree argument.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"
#   nemo_rl_tree "[pytest args]" "$@"; shift    # SRC: the tree, absolute; else the usage, exit 2
#
# Sets REPO (this checkout's root) and ENV_DIR (NEMO_RL_ENV, default
# ~/.cache/nemo-fp8-rl/nemo-rl-env).

# shellcheck disable=SC2034  # read by the scripts that source this file
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC2034
ENV_DIR=${NEMO_RL_ENV:-$HOME/.cache/nemo-fp8-rl/nemo-rl-env}

nemo_rl_tree() {  # USAGE_TAIL TREE [...]: sets SRC, or prints the usage and exits 2
  local rest=$1
  if [[ $# -lt 2 || ! -d "$2/nemo_rl" ]]; then
    echo "usage: $0 /path/to/nemo-rl $rest   (a NeMo RL source tree: it must hold nemo_rl/)" >&2
    exit 2
  fi
  SRC=$(cd "$2" && pwd)
}
