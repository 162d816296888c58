#!/usr/bin/env bash
# The hot-record measurement at full length: 20,000 Shopify `orders/create` of one SKU
# through the processor's commit path on the embedded store and on moto (the suite runs
# the same tests with 5,000). Prints the SKU record's size and (moto) each measured
# commit's write units at orders 1, 2,000, 10,000 and 20,000; the tests fail if either
# changed by more than 10% between 2,000 and 20,000 orders. Needs moto in ./.venv
# (tests/run.sh installs it). About 5 minutes on the 2-core machine.
#   bench/hot-record.sh [orders]
set -euo pipefail
cd "$(dirname "$0")/.."
export EINMAL_HOT_RECORD_ORDERS=${1:-20000}
export EINMAL_MOTO_BIN="${EINMAL_MOTO_BIN:-$PWD/.venv/bin/moto_server}"
cargo test --release -p einmal-tests --test it -- --nocapture --test-threads 1 \
  capacity::embedded_hot_sku_record capacity::aws_hot_sku_record 2>&1 | grep -E '^HOT-SKU|test result'
