#!/usr/bin/env bash
# Receiver benchmark on the embedded store: release build, `einmal serve` on a fresh
# temp store, signed Stripe-like ~3 KB payloads with 20% duplicates from concurrent
# keep-alive clients. Prints webhooks/s and ack latency percentiles.
#   bench/receiver.sh [requests] [concurrency]
set -euo pipefail
# Every loadgen connection comes from 127.0.0.1: admit them all as one peer (serve's default is 32).
peer_limit=1024
cd "$(dirname "$0")/.."
requests=${1:-100000}
concurrency=${2:-32}
cargo build --release --quiet --bin einmal --bin einmal-loadgen
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=warn target/release/einmal serve --addr "127.0.0.1:$port" --data-dir "$data" --max-connections-per-peer "$peer_limit" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
target/release/einmal-loadgen --url "http://127.0.0.1:$port" --requests "$requests" \
  --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000
