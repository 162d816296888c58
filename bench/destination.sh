#!/usr/bin/env bash
# Destination benchmark, embedded end to end: release build, `einmal serve` on a fresh
# temp store, signed Stripe-like ~3 KB payloads with 20% duplicates from concurrent
# keep-alive clients (einmal-loadgen), once without a destination and once with an
# HTTP destination on loopback (einmal-bench-sink: answers 200, records arrivals).
# Per run: acked webhooks/s; without the destination the effects' rate (new events /
# from the first send to the last event's finish, read from the store) and ack->effect
# p50/p99; with it delivered events/s (new events / from the first send to the last
# delivery) and ack->delivery p50/p99; then the ratio of the two rates.
# Three runs of each; min/median/max printed.
#   bench/destination.sh [requests] [concurrency] [runs]
set -euo pipefail
# Every loadgen connection comes from 127.0.0.1: admit them all as one peer (serve's default is 32).
peer_limit=1024
cd "$(dirname "$0")/.."
requests=${1:-20000}
concurrency=${2:-32}
runs=${3:-3}
cargo build --release --quiet --bin einmal --bin einmal-loadgen --bin einmal-bench-sink
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# One run: $1 = with|without. Appends one result line to $work/results.
run() {
  local mode=$1 n=$2 data port config sink=""
  data="$work/data-$mode-$n"; port=$(free_port); config=einmal.toml
  if [ "$mode" = with ]; then
    local sink_port; sink_port=$(free_port)
    target/release/einmal-bench-sink --addr "127.0.0.1:$sink_port" --out "$work/arrivals-$n" >/dev/null 2>&1 &
    sink=$!; pids+=("$sink"); wait_port "$sink_port"
    config="$work/einmal-$n.toml"
    cp einmal.toml "$config"
    cat >>"$config" <<TOML

[[destination]]
name = "bench"
tenant = "demo"
provider = "stripe"
kind = "http"
events = ["*"]
url = "http://127.0.0.1:$sink_port/hook"
secrets = ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]
TOML
  fi
  RUST_LOG=warn target/release/einmal serve --addr "127.0.0.1:$port" --data-dir "$data" --config "$config" --max-connections-per-peer "$peer_limit" 2>/dev/null &
  local server=$!; pids+=("$server"); wait_port "$port"
  local out
  out=$(target/release/einmal-loadgen --url "http://127.0.0.1:$port" --config "$config" --requests "$requests" \
    --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000 --seed "$n" --ack-log "$work/acks-$mode-$n" 2>/dev/null)
  local rate; rate=$(sed -n 's/.*connections: \([0-9]*\) webhooks\/s.*/\1/p' <<<"$out")
  if [ "$mode" = with ]; then
    local expected; expected=$(wc -l <"$work/acks-$mode-$n")
    # Wait for every new event to arrive (a bounded wait for an outcome).
    for _ in $(seq 1200); do [ "$(wc -l <"$work/arrivals-$n")" -ge "$expected" ] && break; sleep 0.1; done
    python3 - "$work/acks-$mode-$n" "$work/arrivals-$n" "$rate" >>"$work/results" <<'PY'
import sys
acks = dict(l.split() for l in open(sys.argv[1]))
arr = dict(l.split() for l in open(sys.argv[2]))
lat = sorted((int(arr[e]) - int(a)) / 1000 for e, a in acks.items() if e in arr)
pct = lambda p: lat[min(len(lat) - 1, round((len(lat) - 1) * p))]
span = (max(int(v) for v in arr.values()) - min(int(v) for v in acks.values())) / 1e6
print(f"with {sys.argv[3]} {len(lat) / span:.0f} {pct(0.5):.1f} {pct(0.99):.1f} {len(lat)} {len(acks)}")
PY
    stop "$sink"
  else
    local expected; expected=$(wc -l <"$work/acks-$mode-$n")
    # Wait until every new event is terminal in the store (read-only, beside the server).
    for _ in $(seq 1200); do
      [ "$(python3 - "$data/einmal.sqlite" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(db.execute("SELECT count(*) FROM inbox WHERE state IN ('completed','ignored')").fetchone()[0])
PY
)" -ge "$expected" ] && break; sleep 0.1; done
    python3 - "$work/acks-$mode-$n" "$data/einmal.sqlite" "$rate" >>"$work/results" <<'PY'
import sqlite3, sys
acks = dict(l.split() for l in open(sys.argv[1]))
db = sqlite3.connect(f"file:{sys.argv[2]}?mode=ro", uri=True)
done = {e: ms * 1000 for e, ms in db.execute(
    "SELECT event_id, updated_at_ms FROM inbox WHERE state IN ('completed','ignored')")}
lat = sorted((done[e] - int(a)) / 1000 for e, a in acks.items() if e in done)
pct = lambda p: lat[min(len(lat) - 1, round((len(lat) - 1) * p))]
span = (max(done[e] for e in acks if e in done) - min(int(v) for v in acks.values())) / 1e6
print(f"without {sys.argv[3]} {len(lat) / span:.0f} {pct(0.5):.1f} {pct(0.99):.1f} {len(lat)} {len(acks)}")
PY
  fi
  stop "$server"
}

for n in $(seq "$runs"); do run without "$n"; run with "$n"; done
python3 - "$work/results" "$requests" "$concurrency" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
def show(name, values, unit):
    values = sorted(values)
    print(f"  {name:<34} min {values[0]:>8.1f}  median {statistics.median(values):>8.1f}  max {values[-1]:>8.1f} {unit}")
print(f"{len(rows)//2} runs of {sys.argv[2]} requests (20% duplicates) over {sys.argv[3]} connections")
print("without a destination:")
wo = [r for r in rows if r[0] == "without"]
show("acked", [float(r[1]) for r in wo], "webhooks/s")
show("effects done (first send..last finish)", [float(r[2]) for r in wo], "events/s")
show("ack->effect p50", [float(r[3]) for r in wo], "ms")
show("ack->effect p99", [float(r[4]) for r in wo], "ms")
w = [r for r in rows if r[0] == "with"]
print("with an HTTP destination on loopback:")
show("acked", [float(r[1]) for r in w], "webhooks/s")
show("delivered (first send..last arrival)", [float(r[2]) for r in w], "events/s")
show("ack->delivery p50", [float(r[3]) for r in w], "ms")
show("ack->delivery p99", [float(r[4]) for r in w], "ms")
ratio = statistics.median(float(r[2]) for r in w) / statistics.median(float(r[2]) for r in wo)
print(f"  delivered/s with a destination vs effects/s without (medians): {ratio:.0%} (target >= 80%)")
lost = sum(int(r[6]) - int(r[5]) for r in w) + sum(int(r[6]) - int(r[5]) for r in wo)
print(f"  new events not finished or not delivered: {lost}")
PY
