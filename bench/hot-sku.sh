#!/usr/bin/env bash
# A best-selling SKU on the embedded store: N Shopify `orders/create` of one unit of
# one SKU from C concurrent keep-alive clients (einmal-loadgen --sku), against release
# `einmal serve` on a fresh store per run (stock seeded with `einmal inventory set`).
# Per run: time from the first send until every order is terminal (the latest finish
# time stored on the events), orders/s over that time, orders dead-lettered or not
# completed, whether the stock moved exactly once per order, and the commits that found
# the SKU changed since its load (`conflicts` in serve's final metrics line) per order.
# Three runs per concurrency (the third argument); min / median / max printed.
#   bench/hot-sku.sh [orders] [concurrencies, comma-separated] [runs]
set -euo pipefail
# Every loadgen connection comes from 127.0.0.1: admit them all as one peer (serve's default is 32).
peer_limit=1024
cd "$(dirname "$0")/.."
orders=${1:-12000}
concurrencies=${2:-8,64}
runs=${3:-3}
stock=1000000
cargo build --release --quiet --bin einmal --bin einmal-loadgen
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

# One run: $1 = concurrency, $2 = run number.
run() {
  local c=$1 n=$2 data port server out first_send
  data="$work/data-$c-$n"; port=$(free_port)
  target/release/einmal setup --data-dir "$data" >/dev/null
  target/release/einmal inventory set --data-dir "$data" --tenant demo SKU-HOT --on-hand "$stock" >/dev/null
  RUST_LOG=warn,einmal_cli::serve=info target/release/einmal serve --addr "127.0.0.1:$port" \
    --max-connections-per-peer "$peer_limit" --data-dir "$data" >/dev/null 2>"$work/serve-$c-$n.err" &
  server=$!; pids+=("$server"); wait_port "$port"
  out=$(target/release/einmal-loadgen --url "http://127.0.0.1:$port" --provider shopify \
    --sku SKU-HOT --requests "$orders" --concurrency "$c" --duplicates 0 --seed "$n" 2>/dev/null)
  first_send=$(sed -n 's/^run span: first send \([0-9]*\) us.*/\1/p' <<<"$out")
  python3 - "$data/einmal.sqlite" "$orders" <<'PY'
import sqlite3, sys, time
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
expected = int(sys.argv[2])
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    done = db.execute("SELECT count(*) FROM inbox WHERE state IN ('completed','ignored','dead_letter')").fetchone()[0]
    if done >= expected:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(f"only {done} of {expected} orders terminal after 10 minutes")
PY
  kill -TERM "$server"; wait "$server" || true
  on_hand=$(target/release/einmal inventory show --data-dir "$data" --tenant demo SKU-HOT --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["on_hand"])')
  python3 - "$data/einmal.sqlite" "$first_send" "$work/serve-$c-$n.err" "$on_hand" "$stock" "$orders" "$c" \
    >>"$work/results" <<'PY'
import re, sqlite3, sys
db_path, first_send, err, on_hand, stock, orders, c = sys.argv[1:]
db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
states = dict(db.execute("SELECT state, count(*) FROM inbox GROUP BY state").fetchall())
last = db.execute("SELECT max(updated_at_ms) FROM inbox").fetchone()[0]
t_done = (last * 1000 - int(first_send)) / 1e6
m = re.findall(r"conflicts[\"=:]+\s*(\d+)", open(err).read())
conflicts = int(m[-1]) if m else -1
exact = int(stock) - int(on_hand) == int(orders)
print(c, f"{t_done:.3f}", int(orders) / t_done, states.get("dead_letter", 0),
      int(orders) - states.get("completed", 0), int(exact), conflicts / int(orders))
PY
}

IFS=, read -ra cs <<<"$concurrencies"
for c in "${cs[@]}"; do for n in $(seq "$runs"); do run "$c" "$n"; done; done
python3 - "$work/results" "$orders" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
for c in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == c]
    print(f"{len(rs)} runs of {sys.argv[2]} orders of one SKU from {c} clients")
    def show(name, i, unit):
        v = sorted(float(r[i]) for r in rs)
        print(f"  {name:<38} min {v[0]:>9.2f}  median {statistics.median(v):>9.2f}  max {v[-1]:>9.2f} {unit}")
    show("time until every order is terminal", 1, "s")
    show("orders/s on the one SKU", 2, "orders/s")
    show("conflicts per order", 6, "")
    print(f"  dead letters: {sum(int(r[3]) for r in rs)}, not completed: {sum(int(r[4]) for r in rs)}, "
          f"stock exact in {sum(int(r[5]) for r in rs)} of {len(rs)} runs")
PY
