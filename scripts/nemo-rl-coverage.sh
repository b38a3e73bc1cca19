#!/usr/bin/env bash
# Line coverage of the NeMo RL engine by the tests that run NeMo RL's real code (the contract
# suite), per file: scripts/nemo-rl-coverage.sh /path/to/nemo-rl [pytest args, e.g. -m "slow or not slow"]
#
# The contract suite runs under coverage; child Python processes (the CPU loop's driver, started by
# tests/test_nemo_cpu_loop.py) are measured too, through a sitecustomize that starts coverage in
# every interpreter that sees COVERAGE_PROCESS_START. Ray actors are measured only while they exit
# normally: an actor Ray kills at shutdown loses its data, so worker-side lines count from the
# in-process worker tests (tests/test_nemo_cpu_*_worker.py).
set -euo pipefail
# shellcheck source=scripts/nemo-rl-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/nemo-rl-common.sh"  # REPO, ENV_DIR, nemo_rl_tree
nemo_rl_tree "[pytest args]" "$@"
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/sitecustomize.py" <<'PY'
import coverage

coverage.process_startup()
PY
cat > "$work/coveragerc" <<RC
[run]
parallel = true
data_file = $work/.coverage
source = nemo_fp8_rl.engines.nemo, nemo_fp8_rl.refit
RC
cd "$REPO"
COVERAGE_PROCESS_START="$work/coveragerc" PYTHONPATH="$work" \
  bash scripts/nemo-rl-contract.sh "$SRC" -q "$@" || echo "contract suite failed; coverage below is partial" >&2
bash scripts/nemo-rl-env.sh "$SRC" -- python -m coverage combine --rcfile="$work/coveragerc" -q "$work"
bash scripts/nemo-rl-env.sh "$SRC" -- python -m coverage report --rcfile="$work/coveragerc" \
  --include="nemo_fp8_rl/engines/nemo/*,nemo_fp8_rl/refit/nemo_*"
