#!/usr/bin/env bash
# GPU checks for nemo-fp8-rl, in one run that fits in a few minutes on one H100/H200:
#   1. install the project (uv sync, with the GPU extra: triton),
#   2. every test marked `gpu` in the whole test tree, the FP8 switch test on its own (3.),
#   3. the BF16 shadow pass against FP8 and against a pure-BF16 forward of the same weights
#      (tests/test_nemo_fp8_switch_gpu.py: megatron-core + Transformer Engine; it runs with the
#      first Python that imports transformer_engine, else skips and says why),
#   4. the trainer-side FP8 refit for NeMo RL (tests/test_refit_nemo_gpu.py: the NeMo RL-exact
#      Triton quantizer against the torch path, its share of HBM copy bandwidth, a vLLM refit
#      A/B with greedy outputs compared; with the first Python that imports vLLM),
#   5. every GPU benchmark (the Triton FP8 block-quantization kernel vs HBM copy bandwidth),
#   6. a summary.
# Usage: scripts/gpu_check.sh            (from anywhere; exits non-zero if a step failed)
set -uo pipefail
cd "$(dirname "$0")/.."
log_dir=${GPU_CHECK_LOG_DIR:-gpu_check_logs}
mkdir -p "$log_dir"
status=0
summary=()

step() {  # step NAME COMMAND... : run, tee the log, record pass/fail
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS
  if "$@" 2>&1 | tee "$log_dir/$name.log"; then
    summary+=("PASS  $name ($((SECONDS - start)) s)")
  else
    summary+=("FAIL  $name ($((SECONDS - start)) s), see $log_dir/$name.log")
    status=1
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# Python: the project's uv environment when it can be built; on an offline GPU machine, the
# machine's own python3 (with CUDA torch and Triton) running this checkout, plus any wheels
# carried in .whl/ (e.g. pydantic, pydantic-core, ray) installed to a scratch folder.
if command -v uv >/dev/null 2>&1 && uv sync --extra gpu >"$log_dir/sync.log" 2>&1; then
  py=(uv run python)
  summary+=("PASS  sync (uv environment)")
else
  py=(python3)
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PYTHONPATH"
  fi
  summary+=("NOTE  sync: no uv environment, using $(command -v python3) with this checkout on PYTHONPATH")
fi
step gpu_tests "${py[@]}" -m pytest -m gpu -q -rs -p no:cacheprovider \
  --ignore=tests/test_nemo_fp8_switch_gpu.py --ignore=tests/test_refit_nemo_gpu.py
te_py=("${py[@]}")
if ! "${py[@]}" -c "import transformer_engine.pytorch" >/dev/null 2>&1 \
  && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
  te_py=(env "PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}" python3)  # the machine's TE
fi
step fp8_switch_shadow "${te_py[@]}" -m pytest -m gpu -q -rs -s -p no:cacheprovider \
  tests/test_nemo_fp8_switch_gpu.py
# Trainer-side FP8 refit (NeMo RL path): Triton quantizer bit-exact and its share of HBM copy
# bandwidth, and the vLLM refit A/B (Qwen3-8B config cut to 2 layers, dummy weights, no
# download), run with the first Python that imports vLLM (else the A/B skips and says why).
vllm_py=("${py[@]}")
if ! "${py[@]}" -c "import vllm" >/dev/null 2>&1 \
  && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import vllm" >/dev/null 2>&1; then
  vllm_py=(env "PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}" python3)  # the machine's vLLM
fi
step refit_nemo "${vllm_py[@]}" -m pytest -m gpu -q -rs -s -p no:cacheprovider \
  tests/test_refit_nemo_gpu.py
step bench_quant_blockwise "${py[@]}" benchmarks/bench_quant.py --device cuda --repeats 20
step bench_quant_blockwise_pow2 "${py[@]}" benchmarks/bench_quant.py --device cuda --repeats 20 --spec blockwise_pow2
step bench_quant_rowwise "${py[@]}" benchmarks/bench_quant.py --device cuda --repeats 20 --spec rowwise

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "--- FP8 block quantization (GB/s of BF16 input, share of HBM copy bandwidth)"
grep -h -E "memory copy|triton|tiles" "$log_dir"/bench_quant_*.log || true
echo "--- trainer-side FP8 refit (Triton quantizer vs HBM copy; vLLM refit A/B)"
grep -h -E "^triton quantizer|^refit A/B|SKIPPED" "$log_dir"/refit_nemo.log || true
echo "--- BF16 shadow pass vs FP8 and vs pure BF16 (token log-probs, tiny TE GPTModel)"
grep -h -E "^fp8 switch|SKIPPED" "$log_dir"/fp8_switch_shadow.log || true
exit $status
