#!/usr/bin/env bash
# Retention on the embedded store: does the file plateau, and do the acks stay as fast,
# once the purge deletes as much as comes in? Release `einmal serve` on a fresh store
# per run, with a retention shortened to R seconds: the purge's test-only clock
# (EINMAL_TEST_CLOCK_OFFSET_SECS) runs 30 days - R ahead, so Stripe items (30 days in
# einmal.toml) expire R seconds after they arrive, and the purge passes every 5 s.
# Per run:
#   - a probe at the start: P signed ~3 KB Stripe events as fast as 32 connections go
#     (einmal-loadgen): acks/s and p99 ack latency;
#   - a steady stream at RATE/s for T seconds (T / R retentions), in 10 s loadgen windows;
#     the database file and its WAL are sampled every 5 s;
#   - the same probe at the end, on the plateaued store.
# Printed: the file (+WAL) size at the stream's start, middle and end, its largest
# size in the first and second half, the inbox rows at the end, the probes' acks/s
# and p99 and the first and last stream windows' p99; three runs, min / median / max.
# The payments pay ORDERS orders in turn (einmal-loadgen --orders), as a shop's customers
# do: the business records (state rows) stay ORDERS while the events expire. ORDERS=0 pays
# a new order per event, so the state table grows with the stream: business records are
# kept, by design, beyond the events' retention.
#   bench/retention.sh [T seconds] [R seconds] [RATE] [P] [runs] [ORDERS]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-120}
retention=${2:-20}
rate=${3:-300}
probe=${4:-3000}
runs=${5:-3}
orders=${6:-2000}
bin=${CARGO_TARGET_DIR:-target}/release
cargo build --release --quiet --bin einmal --bin einmal-loadgen
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
size() { stat -c %s "$1" 2>/dev/null || echo 0; }
# "acks/s p99_ms" of a loadgen output.
figures() { sed -n 's/.*: \([0-9]*\) webhooks\/s.*/\1/p; s/.*p99 \([0-9.]*\) ms.*/\1/p' <<<"$1" | paste -sd' '; }

# One run: $1 = run number.
run() {
  local n=$1 data port server start_probe end_probe first last sampler
  data="$work/data-$n"; port=$(free_port)
  EINMAL_TEST_CLOCK_OFFSET_SECS=$((30 * 86400 - retention)) RUST_LOG=warn "$bin/einmal" serve \
    --addr "127.0.0.1:$port" --data-dir "$data" --purge-interval-secs 5 \
    >/dev/null 2>"$work/serve-$n.err" &
  server=$!; pids+=("$server"); wait_port "$port"
  local url="http://127.0.0.1:$port"
  start_probe=$(figures "$("$bin/einmal-loadgen" --url "$url" --requests "$probe" --concurrency 32 \
    --duplicates 0 --orders "$orders" --seed $((n * 1000)) 2>/dev/null)")
  ( t0=$(date +%s); while :; do
      echo "$(( $(date +%s) - t0 )) $(size "$data/einmal.sqlite") $(size "$data/einmal.sqlite-wal")"
      sleep 5; done ) >"$work/sizes-$n" &
  sampler=$!; pids+=("$sampler")
  local windows=$((duration / 10)) w out
  for w in $(seq "$windows"); do
    out=$("$bin/einmal-loadgen" --url "$url" --requests $((rate * 10)) --rate "$rate" \
      --concurrency 16 --orders "$orders" --seed $((n * 1000 + w)) 2>/dev/null)
    [[ $w == 1 ]] && first=$(figures "$out")
    last=$(figures "$out")
  done
  kill "$sampler"; wait "$sampler" 2>/dev/null || true
  end_probe=$(figures "$("$bin/einmal-loadgen" --url "$url" --requests "$probe" --concurrency 32 \
    --duplicates 0 --orders "$orders" --seed $((n * 1000 + 999)) 2>/dev/null)")
  kill -TERM "$server"; wait "$server" || true
  local rows
  # "inbox_rows state_rows" at the end.
  rows=$(python3 -c "import sqlite3,sys; db=sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True); print(*(db.execute(f'SELECT count(*) FROM {t}').fetchone()[0] for t in ('inbox', 'state')))" "$data/einmal.sqlite")
  python3 - "$work/sizes-$n" "$start_probe" "$end_probe" "$first" "$last" "$rows" >>"$work/results" <<'PY'
import sys
samples = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 3]
mb = lambda s: (s[1] + s[2]) / 1e6
half = len(samples) // 2
start, middle, end = samples[0], samples[half], samples[-1]
print(mb(start), mb(middle), mb(end), max(map(mb, samples[:half])), max(map(mb, samples[half:])),
      *sys.argv[2].split(), *sys.argv[3].split(), sys.argv[4].split()[1], sys.argv[5].split()[1], *sys.argv[6].split())
PY
  cp "$work/sizes-$n" "$work/kept-sizes-$n"
}

for n in $(seq "$runs"); do run "$n"; done
echo "samples of run 1 (seconds into the stream, file bytes, WAL bytes):"
paste -sd' ' "$work/kept-sizes-1" | fold -w 120
python3 - "$work/results" "$duration" "$retention" "$rate" "$probe" "$orders" <<'PY'
import sys, statistics
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
d, r, rate, p, orders = sys.argv[2:]
print(f"{len(rows)} runs: {rate}/s of signed ~3 KB Stripe events for {d} s, retention {r} s "
      f"(the stream passes it {int(d) // int(r)} times), purge every 5 s; probes of {p} events over 32 connections; "
      f"paying {orders + ' orders in turn' if orders != '0' else 'a new order each'}")
def show(name, i, unit):
    v = sorted(row[i] for row in rows)
    print(f"  {name:<44} min {v[0]:>9.2f}  median {statistics.median(v):>9.2f}  max {v[-1]:>9.2f} {unit}")
show("file + WAL at the stream's start", 0, "MB")
show("file + WAL in the middle", 1, "MB")
show("file + WAL at the end", 2, "MB")
show("largest file + WAL, first half", 3, "MB")
show("largest file + WAL, second half", 4, "MB")
show("inbox rows at the end", 11, "")
show("state rows (business records) at the end", 12, "")
show("probe at the start: acks/s", 5, "webhooks/s")
show("probe at the end: acks/s", 7, "webhooks/s")
show("probe at the start: p99 ack latency", 6, "ms")
show("probe at the end: p99 ack latency", 8, "ms")
show("stream, first 10 s window: p99 ack latency", 9, "ms")
show("stream, last 10 s window: p99 ack latency", 10, "ms")
PY
