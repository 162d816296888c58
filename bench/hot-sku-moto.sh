#!/usr/bin/env bash
# A best-selling SKU on the AWS path (DynamoDB + SQS on moto, single-threaded as the suite
# runs it): N Shopify `orders/create` of one unit of one SKU from C concurrent clients
# through the receiver's ingest, while two processors take SQS batches of 10 side by side
# (two concurrent Lambda invocations); the queue redrives after 2 receives. The suite's
# scenario (tests/it/hot_record.rs) at full size: passes when every order completed, none
# is dead-lettered and the stock moved once per order; prints per run the time until every
# order is terminal, orders/s and conflicts per order, then min/median/max.
#   bench/hot-sku-moto.sh [orders] [concurrencies, comma-separated] [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
export EINMAL_HOT_ORDERS=${1:-12000}
concurrencies=${2:-8,64}
runs=${3:-3}
profile=${PROFILE:-release}
flag=(); [ "$profile" = release ] && flag=(--release)
if [ -z "${EINMAL_MOTO_BIN:-}" ] && [ -x .venv/bin/moto_server ]; then
  export EINMAL_MOTO_BIN="$PWD/.venv/bin/moto_server"
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for c in ${concurrencies//,/ }; do
  for n in $(seq "$runs"); do
    echo "== $c clients, run $n"
    EINMAL_HOT_CLIENTS=$c cargo test "${flag[@]}" --quiet -p einmal-tests --test it \
      hot_record::aws_hot_sku_two_processors -- --nocapture | tee -a "$out" \
      | grep -E "orders/s|test result"
  done
  grep -E "^aws: .* $c clients" "$out" | sed -E 's/.* ([0-9.]+) orders\/s.*/\1/' | sort -n \
    | awk -v c="$c" '{v[NR]=$1} END {if (NR) printf "moto, %s clients: orders/s min %.0f, median %.0f, max %.0f (%d runs)\n", c, v[1], v[int((NR+1)/2)], v[NR], NR}'
done
