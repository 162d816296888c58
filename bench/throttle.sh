#!/usr/bin/env bash
# The 15-minute throttle at full length: the suite's outage scenario (tests/it/outage.rs)
# with production timings instead of CI's scaled-down ones. Orders, payments and refunds
# are acknowledged; then every DynamoDB call answers ProvisionedThroughputExceededException
# (a fault proxy in front of moto) — or, on the embedded store, the state store is down —
# for EINMAL_OUTAGE_SECS (900), while the processor runs with the production backoff
# (2 s doubling, capped at 15 min) and maxReceiveCount 5. Passes when every event
# completes with its effects once and nothing is dead-lettered; prints, per run and
# backend, how long after the recovery every event was terminal, then min/median/max.
#   bench/throttle.sh [runs] [outage seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
export EINMAL_OUTAGE_SECS=${2:-900}
export EINMAL_OUTAGE_BACKOFF_BASE_MS=2000
export EINMAL_OUTAGE_BACKOFF_MAX_MS=900000
export EINMAL_OUTAGE_MAX_RECEIVES=5
profile=${PROFILE:-release}
flag=(); [ "$profile" = release ] && flag=(--release)
if [ -z "${EINMAL_MOTO_BIN:-}" ] && [ -x .venv/bin/moto_server ]; then
  export EINMAL_MOTO_BIN="$PWD/.venv/bin/moto_server"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for n in $(seq "$runs"); do
  echo "== run $n: outage ${EINMAL_OUTAGE_SECS} s"
  cargo test "${flag[@]}" --quiet -p einmal-tests --test it outage:: -- --nocapture --test-threads 2 \
    | tee -a "$out" | grep -E "after recovery|test result"
done
for backend in aws embedded; do
  grep -E "^$backend: outage" "$out" | sed -E 's/.* ([0-9.]+) s after recovery/\1/' | sort -n \
    | awk -v b="$backend" '{v[NR]=$1} END {if (NR) printf "%s: terminal after recovery min %.1f s, median %.1f s, max %.1f s (%d runs)\n", b, v[1], v[int((NR+1)/2)], v[NR], NR}'
done
