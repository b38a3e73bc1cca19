#!/usr/bin/env bash
# NeMo RL contract suite (scripts/nemo-rl-contract.sh) against every vendored NeMo RL snapshot.
#
# The snapshots are tarballs in ../shared/vendor (NEMO_RL_VENDOR overrides), each unpacking to
# nemo-rl/ (see that folder's README). Each is unpacked into a temporary folder and the suite
# runs against it; the time of each run is printed. A fresh clone without that folder (a user's)
# skips the step and says why. Exit status: non-zero when any suite failed or collected nothing.
# NeMo RL's loop on CPU (tests/test_nemo_cpu_loop.py, a real 5-step run) runs against one
# snapshot, NEMO_RL_LOOP_SNAPSHOT (default: main, nemo-rl-7ea279a), to keep CI within 30 minutes;
# every other contract test runs against each snapshot. Against that snapshot the tests of NeMo
# RL's own vLLM worker on vLLM's CPU build (tests/test_nemo_cpu_vllm_*.py) also run in the
# environment with vLLM at the snapshot's pin (scripts/nemo-rl-contract.sh --vllm; SKIP_VLLM=1
# leaves them out); the 10-step loop on real vLLM is in scripts/slow_tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

VENDOR="${NEMO_RL_VENDOR:-../shared/vendor}"
LOOP_SNAPSHOT="${NEMO_RL_LOOP_SNAPSHOT:-nemo-rl-7ea279a}"
shopt -s nullglob
archives=("$VENDOR"/nemo-rl-*.tar.gz)
if [[ ${#archives[@]} -eq 0 ]]; then
    echo "contract: skipped: no NeMo RL snapshot (nemo-rl-*.tar.gz) in $VENDOR;" \
        "run scripts/nemo-rl-contract.sh /path/to/nemo-rl against a NeMo RL checkout instead"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
times=()
for archive in "${archives[@]}"; do
    name=$(basename "$archive" .tar.gz)
    mkdir -p "$tmp/$name"
    tar -xzf "$archive" -C "$tmp/$name"
    select=()
    if [[ "$name" != "$LOOP_SNAPSHOT" ]]; then
        select=(-k "not test_nemo_cpu_loop")
        echo "-- contract: $name (NeMo RL's loop on CPU runs against $LOOP_SNAPSHOT only)"
    else
        echo "-- contract: $name"
    fi
    start=$SECONDS
    # pytest exit 5 (nothing collected) is non-zero too: a snapshot must run its contract tests.
    if bash scripts/nemo-rl-contract.sh "$tmp/$name/nemo-rl" -q "${select[@]}" "$@"; then
        result=passed
    else
        result="FAILED (exit $?)"
        status=1
    fi
    times+=("$name: $result in $((SECONDS - start)) s")
    if [[ "$name" == "$LOOP_SNAPSHOT" && "${SKIP_VLLM:-0}" != "1" ]]; then
        echo "-- contract: $name with vLLM's CPU build (NeMo RL's own vLLM worker)"
        start=$SECONDS
        if bash scripts/nemo-rl-contract.sh --vllm "$tmp/$name/nemo-rl" -q -k "cpu_vllm" "$@"; then
            result=passed
        else
            result="FAILED (exit $?)"
            status=1
        fi
        times+=("$name (vLLM): $result in $((SECONDS - start)) s")
    fi
done
echo "-- contract suite times"
printf '   %s\n' "${times[@]}"
exit $status
