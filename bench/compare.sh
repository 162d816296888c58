#!/usr/bin/env bash
# einmal against the recipes users write by hand (bench/peers/), on the same machine with
# the same load generator and seed: signed ~3 KB Stripe `payment_intent.succeeded`
# events, 20% duplicates, keep-alive clients (einmal-loadgen).
#   - einmal: release `einmal serve` on a fresh temp store, as bench/end-to-end.sh runs
#     it; effects/s = new events / (first send .. the latest finish time stored on them).
#   - node-full: fastify + stripe-node + pg, one transaction per webhook (dedup insert,
#     order paid, one invoice, one notification), 2 workers; effects are done at the ack.
#   - node-ack: the same without the business write (verify + the dedup insert).
#   - python-full: FastAPI + asyncpg + stripe under uvicorn, 2 workers, as node-full.
# The peers share one PostgreSQL 15 started here in a temp dir (defaults: fsync on,
# synchronous_commit on), their tables emptied before each run. The systems run
# interleaved, `rounds` times (round n uses seed n for all). Per run: acks/s and p50/p99
# ack latency from the loadgen; effects/s; the peak RSS of the server's processes
# (VmHWM, summed); CPU seconds per 1,000 webhooks of the server's process tree, and with
# PostgreSQL's added (utime+stime from /proc, before .. after). One markdown table,
# min–max over the rounds, and the ratios per round.
# With HOT=<orders> (default 12000; 0 skips) also a hot record: that many Shopify
# `orders/create` of one SKU, einmal (as bench/hot-sku.sh) against node-full's
# `UPDATE stock SET on_hand = on_hand - 1` in the webhook's transaction.
#   bench/compare.sh [requests] [concurrency] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-20000}
concurrency=${2:-64}
rounds=${3:-3}
hot=${HOT:-12000}
peers=bench/peers
bin=${CARGO_TARGET_DIR:-target}/release
# All the loadgen's connections come from one address; `einmal serve` admits 32 per peer
# by default (503 beyond), so allow the whole load generator as one peer.
per_peer=$(( concurrency > 32 ? concurrency : 32 ))

# Dependencies into the bench folder (gitignored), then the release binaries.
for p in node-full node-ack; do (cd "$peers/$p" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); done
[ -x "$peers/python-full/.venv/bin/python" ] || python3 -m venv "$peers/python-full/.venv"
"$peers/python-full/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$peers/python-full/requirements.txt"
cargo build --release --quiet --bin einmal --bin einmal-loadgen

work=$(mktemp -d)
pids=()
pg=
# Servers first (newest first), then PostgreSQL with SIGINT (fast shutdown: a SIGTERM
# would wait for its clients to leave).
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true; wait "${pids[i]}" 2>/dev/null || true
  done
  if [ -n "$pg" ]; then kill -INT "$pg" 2>/dev/null || true; wait "$pg" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
# uvicorn binds before its workers import the app: wait for an HTTP answer (any status).
wait_http() { for _ in $(seq 300); do curl -s -o /dev/null -m 2 "http://127.0.0.1:$1/" && return 0; sleep 0.1; done; echo "no HTTP answer on $1" >&2; return 1; }
# The load generator; its stderr is shown if it fails (any failed request fails it).
loadgen() { "$bin/einmal-loadgen" "$@" 2>"$work/loadgen.err" || { cat "$work/loadgen.err" >&2; return 1; }; }
# The servers verify with the demo tenants' secrets of einmal.toml, as einmal does;
# read here so that they are never printed.
secret_of() { python3 -c 'import sys, tomllib; t = tomllib.load(open("einmal.toml", "rb"))["tenant"]; print(next(x["secrets"][0] for x in t if x["provider"] == sys.argv[1] and x["tenant"] == "demo"))' "$1"; }
export STRIPE_WEBHOOK_SECRET SHOPIFY_SECRET
STRIPE_WEBHOOK_SECRET=$(secret_of stripe)
SHOPIFY_SECRET=$(secret_of shopify)

# "cpu_seconds peak_rss_kb pid…" of a process tree: utime+stime (+ reaped children's
# cutime+cstime, so exited backends count) and VmHWM summed over its live processes.
tree() {
  python3 - "$1" <<'PY'
import os, sys
root, tck = int(sys.argv[1]), os.sysconf("SC_CLK_TCK")
parent = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            parent[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
tree, grew = {root}, True
while grew:
    more = {p for p, pp in parent.items() if pp in tree} - tree
    tree |= more; grew = bool(more)
cpu = hwm = 0
for p in tree:
    try:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        cpu += sum(int(x) for x in f[11:15]) / tck
        hwm += next(int(l.split()[1]) for l in open(f"/proc/{p}/status") if l.startswith("VmHWM"))
    except (OSError, StopIteration):
        pass
print(f"{cpu:.2f}", hwm, *sorted(tree))
PY
}

# PostgreSQL for the peers: refuses to run as root, so then as the `postgres` user
# (PG_OS_USER); setpriv execs, so the PID we stop is the postmaster's.
pgdata=$work/pg; pgsock=$work/pgsock; mkdir -p "$pgdata" "$pgsock"
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chmod 711 "$work"; chown "${PG_OS_USER:-postgres}" "$pgdata" "$pgsock"
  as_pg=(setpriv --reuid="${PG_OS_USER:-postgres}" --regid="$(id -g "${PG_OS_USER:-postgres}")" --init-groups)
fi
"${as_pg[@]}" initdb -D "$pgdata" -U bench -A trust --no-sync >"$work/initdb.log" 2>&1 \
  || { cat "$work/initdb.log" >&2; exit 1; }
export PGHOST=$pgsock PGPORT PGUSER=bench PGDATABASE=bench
PGPORT=$(free_port)
"${as_pg[@]}" postgres -D "$pgdata" -p "$PGPORT" -k "$pgsock" -c listen_addresses='' >"$work/pg.log" 2>&1 &
pg=$!
for _ in $(seq 100); do pg_isready -q && break; sleep 0.1; done
pg_isready -q || { cat "$work/pg.log" >&2; exit 1; }
psql -d postgres -qc 'CREATE DATABASE bench'
psql -q -v ON_ERROR_STOP=1 -f "$peers/schema.sql"
sql() { psql -Atqc "$1"; }

# Loadgen output -> "acks/s accepted elapsed_s p50_ms p99_ms first_send_us".
parse() {
  python3 -c '
import re, sys
o = sys.stdin.read()
m = re.search(r"requests in ([\d.]+)s over \d+ connections: (\d+) webhooks/s; accepted (\d+)", o)
l = re.search(r"p50 ([\d.]+) ms, p90 [\d.]+ ms, p99 ([\d.]+) ms", o)
f = re.search(r"first send (\d+) us", o)
print(m[2], m[3], m[1], l[1], l[2], f[1])'
}

# One einmal run: $1 = round (seed). Appends a result line.
run_einmal() {
  local n=$1 data port server out before after
  data="$work/einmal-$n"; port=$(free_port)
  RUST_LOG=warn "$bin/einmal" serve --addr "127.0.0.1:$port" --data-dir "$data" \
    --max-connections-per-peer "$per_peer" \
    >/dev/null 2>"$work/einmal-$n.err" &
  server=$!; pids+=("$server"); wait_port "$port"
  before=$(tree "$server" | cut -d' ' -f1)
  out=$(loadgen --url "http://127.0.0.1:$port" --requests "$requests" \
    --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000 --seed "$n" \
    --ack-log "$work/acks-einmal-$n" | parse)
  # Wait (bounded) until every new event is terminal; the figures come from the times
  # stored on the events (as bench/end-to-end.sh), not from this loop.
  python3 - "$data/einmal.sqlite" "$work/acks-einmal-$n" <<'PY'
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
  after=$(tree "$server")   # CPU until the effects are done, and the peak RSS
  kill -TERM "$server"; wait "$server" || true
  python3 - "$data/einmal.sqlite" "$work/acks-einmal-$n" "$n" "$before" "$after" "$requests" $out \
    >>"$work/results" <<'PY'
import sqlite3, sys
db_path, acks_path, n, before, after, requests, acks_s, accepted, elapsed, p50, p99, first = sys.argv[1:]
acks = [l.split()[0] for l in open(acks_path)]
db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
rows = dict((e, (s, f)) for e, s, f in db.execute("SELECT event_id, state, updated_at_ms FROM inbox"))
t_done = (max(rows[e][1] for e in acks) * 1000 - int(first)) / 1e6
bad = sum(1 for e in acks if rows[e][0] != "completed")
a = after.split()
cpu = (float(a[0]) - float(before)) / int(requests) * 1000
check = "ok" if bad == 0 and len(acks) == int(accepted) else f"{bad}_not_completed"
print("einmal", n, acks_s, f"{len(acks) / t_done:.0f}", p50, p99, f"{int(a[1]) / 1024:.0f}",
      f"{cpu:.3f}", f"{cpu:.3f}", check)
PY
}

# One peer run: $1 = peer, $2 = round. Appends a result line.
run_peer() {
  local peer=$1 n=$2 port server out before after pg_before pg_after
  port=$(free_port)
  sql 'TRUNCATE events, notifications, invoices, orders, stock; CHECKPOINT'
  case $peer in
    node-*) PORT=$port node "$peers/$peer/server.js" >"$work/$peer-$n.log" 2>&1 & ;;
    python-full) (cd "$peers/python-full" && exec .venv/bin/uvicorn app:app --host 127.0.0.1 \
        --port "$port" --workers 2 --no-access-log --log-level warning) >"$work/$peer-$n.log" 2>&1 & ;;
  esac
  server=$!; pids+=("$server"); wait_http "$port"
  sleep 1   # one worker answered; let the other come up too
  before=$(tree "$server" | cut -d' ' -f1); pg_before=$(tree "$pg" | cut -d' ' -f1)
  out=$(loadgen --url "http://127.0.0.1:$port" --requests "$requests" \
    --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000 --seed "$n" | parse)
  after=$(tree "$server"); pg_after=$(tree "$pg" | cut -d' ' -f1)
  kill -TERM "$server"; wait "$server" || true
  # What the recipe wrote, to check it against the accepted count.
  local counts
  counts=$(sql "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM orders WHERE payment_status = 'paid'),
    (SELECT count(*) FROM invoices), (SELECT count(*) FROM notifications)" | tr '|' ' ')
  python3 - "$peer" "$n" "$before" "$after" "$pg_before" "$pg_after" "$requests" $counts $out \
    >>"$work/results" <<'PY'
import sys
peer, n, before, after, pgb, pga, requests, ev, paid, inv, notif, acks_s, accepted, elapsed, p50, p99, first = sys.argv[1:]
a = after.split()
cpu = (float(a[0]) - float(before)) / int(requests) * 1000
cpu_pg = cpu + (float(pga) - float(pgb)) / int(requests) * 1000
want = [int(accepted)] * (4 if peer.endswith("full") else 1)
got = [int(ev), int(paid), int(inv), int(notif)][:len(want)]
check = "ok" if got == want else "rows_" + "/".join(map(str, got)) + "_accepted_" + accepted
print(peer, n, acks_s, f"{int(accepted) / float(elapsed):.0f}", p50, p99, f"{int(a[1]) / 1024:.0f}",
      f"{cpu:.3f}", f"{cpu_pg:.3f}", check)
PY
}

# The hot record: $1 = einmal|node-full, $2 = round. Appends "hot …" lines.
run_hot() {
  local sys=$1 n=$2 port server out data
  port=$(free_port)
  if [ "$sys" = einmal ]; then
    data="$work/hot-$n"
    "$bin/einmal" setup --data-dir "$data" >/dev/null
    "$bin/einmal" inventory set --data-dir "$data" --tenant demo SKU-HOT --on-hand 1000000 >/dev/null
    RUST_LOG=warn "$bin/einmal" serve --addr "127.0.0.1:$port" --data-dir "$data" \
      --max-connections-per-peer "$per_peer" \
      >/dev/null 2>"$work/hot-$n.err" &
  else
    sql "TRUNCATE events, notifications, invoices, orders, stock; INSERT INTO stock VALUES ('SKU-HOT', 1000000); CHECKPOINT"
    PORT=$port node "$peers/node-full/server.js" >"$work/hot-node-$n.log" 2>&1 &
  fi
  server=$!; pids+=("$server"); wait_http "$port"; sleep 1
  out=$(loadgen --url "http://127.0.0.1:$port" --provider shopify --sku SKU-HOT \
    --requests "$hot" --concurrency "$concurrency" --duplicates 0 --seed "$n" | parse)
  if [ "$sys" = einmal ]; then
    python3 - "$data/einmal.sqlite" "$hot" <<'PY'
import sqlite3, sys, time
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    if db.execute("SELECT count(*) FROM inbox WHERE state IN ('completed','ignored','dead_letter')").fetchone()[0] >= int(sys.argv[2]):
        sys.exit(0)
    time.sleep(0.2)
sys.exit("orders not terminal after 10 minutes")
PY
    kill -TERM "$server"; wait "$server" || true
    local on_hand
    on_hand=$("$bin/einmal" inventory show --data-dir "$data" --tenant demo SKU-HOT --json \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["on_hand"])')
    python3 - "$data/einmal.sqlite" "$hot" "$on_hand" $out >>"$work/results" <<'PY'
import sqlite3, sys
db_path, orders, on_hand, acks_s, accepted, elapsed, p50, p99, first = sys.argv[1:]
db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
states = dict(db.execute("SELECT state, count(*) FROM inbox GROUP BY state").fetchall())
t = (db.execute("SELECT max(updated_at_ms) FROM inbox").fetchone()[0] * 1000 - int(first)) / 1e6
exact = 1000000 - int(on_hand) == int(orders)
print("hot einmal", f"{int(orders) / t:.0f}", states.get("dead_letter", 0), int(exact), p99)
PY
  else
    kill -TERM "$server"; wait "$server" || true
    local on_hand
    on_hand=$(sql "SELECT on_hand FROM stock WHERE sku = 'SKU-HOT'")
    python3 - "$hot" "$on_hand" $out >>"$work/results" <<'PY'
import sys
orders, on_hand, acks_s, accepted, elapsed, p50, p99, first = sys.argv[1:]
# Effects are done at the ack; the loadgen fails the run if any request failed.
exact = 1000000 - int(on_hand) == int(orders) == int(accepted)
print("hot node-full", f"{int(orders) / float(elapsed):.0f}", 0, int(exact), p99)
PY
  fi
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for n in $(seq "$rounds"); do
  echo "round $n: einmal" >&2; run_einmal "$n"
  for peer in node-full node-ack python-full; do echo "round $n: $peer" >&2; run_peer "$peer" "$n"; done
done
if [ "$hot" -gt 0 ]; then
  for n in $(seq "$rounds"); do
    echo "hot round $n" >&2; run_hot einmal "$n"; run_hot node-full "$n"
  done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work/results" "$requests" "$concurrency" "$rounds" "$hot" "$load_before" "$load_after" \
  "$(git rev-parse --short HEAD)" "$(nproc)" <<'PY'
import statistics, sys
path, requests, conc, rounds, hot, lb, la, commit, cpus = sys.argv[1:]
rows = [l.split() for l in open(path)]
runs = [r for r in rows if r[0] != "hot"]
def span(vals, fmt="{:,.0f}"):
    vals = sorted(vals)
    lo, hi = fmt.format(vals[0]), fmt.format(vals[-1])
    return lo if lo == hi else f"{lo}–{hi}"
names = {
    "einmal": "einmal `serve` (effects from the stored finish times)",
    "node-full": "node-full: fastify + stripe-node + pg, one transaction (dedup, order paid, invoice, notification), 2 workers",
    "node-ack": "node-ack: the same, verify + dedup insert only",
    "python-full": "python-full: FastAPI + asyncpg + stripe, uvicorn 2 workers, as node-full",
}
print(f"{rounds} interleaved round(s) of {int(requests):,} signed ~3 KB Stripe events, 20% duplicates, "
      f"{conc} connections; commit {commit}, {cpus} cores, load average {lb} before, {la} after")
print()
print("| system | acks/s | effects/s | ack p50 | ack p99 | peak RSS | CPU s / 1k webhooks (server) | CPU s / 1k (+ PostgreSQL) | checks |")
print("|---|---|---|---|---|---|---|---|---|")
by = {}
for r in runs:
    by.setdefault(r[0], []).append(r)
for sysname in ["einmal", "node-full", "node-ack", "python-full"]:
    rs = by.get(sysname, [])
    if not rs:
        continue
    col = lambda i: [float(r[i]) for r in rs]
    eff = span(col(3)) if sysname != "node-ack" else "–"
    checks = ",".join(sorted({r[9] for r in rs}))
    print(f"| {names[sysname]} | {span(col(2))} | {eff} | {span(col(4), '{:.1f}')} ms | {span(col(5), '{:.1f}')} ms "
          f"| {span(col(6))} MB | {span(col(7), '{:.3f}')} | {span(col(8), '{:.3f}')} | {checks} |")
print()
per_round = {}
for r in runs:
    per_round.setdefault(r[1], {})[r[0]] = r
def ratio(a, b, i):
    v = [float(x[a][i]) / float(x[b][i]) for x in per_round.values() if a in x and b in x]
    return span(v, "{:.2f}") + "×" if v else "n/a"
print(f"- einmal ÷ node-full, effects/s: {ratio('einmal', 'node-full', 3)} (per round)")
print(f"- einmal ÷ python-full, effects/s: {ratio('einmal', 'python-full', 3)}")
print(f"- einmal ÷ node-ack, acks/s: {ratio('einmal', 'node-ack', 2)}")
hots = [r for r in rows if r[0] == "hot"]
if hots:
    print()
    print(f"Hot record: {int(hot):,} Shopify `orders/create` of one SKU, {conc} connections")
    print()
    print("| system | orders/s (until every effect is done) | dead letters | stock exact | ack p99 |")
    print("|---|---|---|---|---|")
    for s, label in [("einmal", "einmal `serve` (stored finish times)"),
                     ("node-full", "node-full: `UPDATE stock SET on_hand = on_hand - 1` in the webhook's transaction")]:
        hs = [h for h in hots if h[1] == s]
        if hs:
            print(f"| {label} | {span([float(h[2]) for h in hs])} | {sum(int(h[3]) for h in hs)} "
                  f"| {sum(int(h[4]) for h in hs)} of {len(hs)} | {span([float(h[5]) for h in hs], '{:.1f}')} ms |")
PY
