#!/usr/bin/env bash
# End-to-end benchmark on the embedded store: do the business effects keep up with
# the acks? Release `einmal serve` on a fresh temp store per run, signed Stripe-like
# ~3 KB payloads with 20% duplicates from concurrent keep-alive clients
# (einmal-loadgen), no destination.
#
# Mode "max" (as fast as the connections go), per run:
#   - time until the last ack (loadgen's first send .. its last 200);
#   - time until every new event is terminal (first send .. the latest finish time
#     stored on the events; the store is polled read-only until all are terminal);
#   - their ratio (target <= 1.1), and the drain rate (new events / time until
#     terminal) against the ack rate of new events (new events / time until last ack);
#   - the writer's fsynced commits per batch the processor handled (target <= 1),
#     from the store's counters that `einmal serve` prints when it stops.
# Mode "half": the same at half the median ack rate of the "max" runs (loadgen
# --rate), printing ack->effect latency p50/p99 from each event's stored times
# (received_at_ms .. the finish's updated_at_ms; target p99 < 500 ms).
# Three runs of each (the third argument); min / median / max printed.
#   bench/end-to-end.sh [requests] [concurrency] [runs]
set -euo pipefail
# Every loadgen connection comes from 127.0.0.1: admit them all as one peer (serve's default is 32).
peer_limit=1024
cd "$(dirname "$0")/.."
requests=${1:-20000}
concurrency=${2:-64}
runs=${3:-3}
cargo build --release --quiet --bin einmal --bin einmal-loadgen
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

# One run: $1 = max|half, $2 = run number, $3 = rate (0 = unlimited).
run() {
  local mode=$1 n=$2 rate=$3 data port server out
  data="$work/data-$mode-$n"; port=$(free_port)
  RUST_LOG=warn target/release/einmal serve --addr "127.0.0.1:$port" --data-dir "$data" \
    --max-connections-per-peer "$peer_limit" \
    >/dev/null 2>"$work/serve-$mode-$n.err" &
  server=$!; pids+=("$server"); wait_port "$port"
  out=$(target/release/einmal-loadgen --url "http://127.0.0.1:$port" --requests "$requests" \
    --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000 --seed "$n" --rate "$rate" \
    --ack-log "$work/acks-$mode-$n" 2>/dev/null)
  local first_send acked
  first_send=$(sed -n 's/^run span: first send \([0-9]*\) us.*/\1/p' <<<"$out")
  acked=$(sed -n 's/.*connections: \([0-9]*\) webhooks\/s.*/\1/p' <<<"$out")
  # Wait (bounded, 10 min) until every new event is terminal; the figures come from
  # the times stored on the events, not from this loop.
  python3 - "$data/einmal.sqlite" "$work/acks-$mode-$n" <<'PY'
import sqlite3, sys, time
expected = sum(1 for _ in open(sys.argv[2]))
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    done = db.execute("SELECT count(*) FROM inbox WHERE state IN ('completed','ignored','dead_letter')").fetchone()[0]
    if done >= expected:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(f"only {done} of {expected} events terminal after 10 minutes")
PY
  # SIGTERM: `einmal serve` drains and prints its store counters on stderr.
  kill -TERM "$server"; wait "$server" || true
  python3 - "$data/einmal.sqlite" "$work/acks-$mode-$n" "$first_send" "$acked" "$mode" \
    "$work/serve-$mode-$n.err" >>"$work/results" <<'PY'
import re, sqlite3, sys
db_path, acks_path, first_send, acked, mode, err = sys.argv[1:]
first_send = int(first_send)
acks = dict(l.split() for l in open(acks_path))
db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
rows = {e: (state, rec, fin) for e, state, rec, fin in db.execute(
    "SELECT event_id, state, received_at_ms, updated_at_ms FROM inbox")}
new = [rows[e] for e in acks]
not_completed = sum(1 for s, _, _ in new if s != "completed")
t_ack = (max(int(a) for a in acks.values()) - first_send) / 1e6
t_done = (max(fin for _, _, fin in new) * 1000 - first_send) / 1e6
lat = sorted(fin - rec for _, rec, fin in new)
pct = lambda p: lat[min(len(lat) - 1, round((len(lat) - 1) * p))]
stats = re.search(r"store: (\d+) commits, (\d+) fsynced, (\d+) fsynced with business commits; "
                  r"processor: (\d+) batches, (\d+) messages", open(err).read())
commits, fsyncs, effects, batches, messages = (int(x) for x in stats.groups()) if stats else (0,) * 5
print(mode, acked, len(acks), f"{t_ack:.3f}", f"{t_done:.3f}", pct(0.5), pct(0.99),
      not_completed, commits, fsyncs, batches, messages, effects)
PY
}

summary() {
  python3 - "$work/results" "$requests" "$concurrency" "$1" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
mode = sys.argv[4]
rows = [r for r in rows if r[0] == mode]
def show(name, values, unit):
    values = sorted(values)
    print(f"  {name:<46} min {values[0]:>9.2f}  median {statistics.median(values):>9.2f}  max {values[-1]:>9.2f} {unit}")
f = lambda i: [float(r[i]) for r in rows]
new = f(2); t_ack = f(3); t_done = f(4)
if mode == "max":
    print(f"{len(rows)} runs of {sys.argv[2]} requests (20% duplicates) over {sys.argv[3]} connections, as fast as they go")
else:
    print(f"{len(rows)} runs of {sys.argv[2]} requests at {rows[0][13]} requests/s (half the max median ack rate)")
show("acked (loadgen)", f(1), "webhooks/s")
show("time until the last ack", t_ack, "s")
show("time until every event is terminal", t_done, "s")
show("terminal / last ack (target <= 1.1)", [d / a for a, d in zip(t_ack, t_done)], "x")
show("ack rate of new events", [n / a for n, a in zip(new, t_ack)], "events/s")
show("drain rate (new events / time until terminal)", [n / d for n, d in zip(new, t_done)], "events/s")
show("drain rate / ack rate (target >= 0.9)", [a / d for a, d in zip(t_ack, t_done)], "x")
show("ack->effect p50 (received..finished)", f(5), "ms")
show("ack->effect p99 (received..finished)", f(6), "ms")
if all(float(r[10]) > 0 for r in rows):
    show("processor batches", f(10), "")
    show("messages per processor batch", [float(r[11]) / float(r[10]) for r in rows], "")
    show("fsynced commits (receiver + processor)", f(9), "")
    show("fsynced commits per new event", [float(r[9]) / float(r[2]) for r in rows], "")
    show("processor fsyncs (with business commits)", f(12), "")
    show("processor fsyncs per batch (target <= 1)", [float(r[12]) / float(r[10]) for r in rows], "")
print(f"  new events not completed: {sum(int(r[7]) for r in rows)}")
PY
}

for n in $(seq "$runs"); do run max "$n" 0; done
summary max
half=$(python3 -c "
import statistics, sys
print(round(statistics.median(float(l.split()[1]) for l in open('$work/results') if l.startswith('max ')) / 2))")
for n in $(seq "$runs"); do run half "$n" "$half"; sed -i '$ s/$/ '"$half"'/' "$work/results"; done
summary half
