#!/usr/bin/env bash
# The disk's group-commit ceiling: how many durable commits a second one thread gets on
# the disk of the data directory, the bound on the receiver's fsynced batches (every
# accepted event is on disk before its 2xx; requests that arrive during one fsync share
# the next). Three ways, each for [seconds] per run, [runs] runs, min/median/max:
#   write+fdatasync  overwrite 4 KiB in place, fdatasync (a reused WAL page)
#   write+fsync      the same with fsync (data and metadata)
#   sqlite-wal       one tiny transaction (one INSERT) per commit, WAL mode,
#                    synchronous=FULL, as the embedded store's writer runs it
# Then compare with bench/receiver.sh: acks/s divided by the sqlite-wal ceiling is how
# many requests share one commit at least.
#
# With RECEIVER=<requests> (e.g. 20000) it then also counts the commits themselves:
# [runs] runs of release `einmal serve` on a fresh store under strace (fsync and
# fdatasync only, through seccomp: the other syscalls run untraced), the load generator
# at CONCURRENCY connections (default 64), and prints the requests per fsync of the
# store's WAL (einmal.sqlite-wal: the receiver's inserts and, sharing the same writer,
# the processor's claims and finishes) and the fsyncs of the other files. The ack rate
# of these runs is lower than bench/receiver.sh's (strace stops the writer at every
# fsync); take the rate from there.
#   bench/fsync.sh [seconds] [runs] [dir]   (dir: default a fresh temp dir, like the
#                                             benchmarks' data dirs)
set -euo pipefail
# Every loadgen connection comes from 127.0.0.1: admit them all as one peer (serve's default is 32).
peer_limit=1024
seconds=${1:-3}
runs=${2:-3}
base=${3:-}
if [ -n "$base" ]; then
  work=$(mktemp -d "$base/einmal-fsync.XXXXXX")
else
  work=$(mktemp -d)
fi
trap 'rm -rf "$work"' EXIT
echo "fsync ceiling on $(df -P "$work" | awk 'NR==2 {print $1 " (" $6 ")"}'), ${seconds} s per run, ${runs} runs"
python3 - "$work" "$seconds" "$runs" <<'PY'
import os, sqlite3, statistics, sys, time

work, seconds, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
page = os.urandom(4096)

def file_loop(sync):
    path = os.path.join(work, "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, page, 0)
        os.fsync(fd)
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            os.pwrite(fd, page, 0)
            sync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        os.unlink(path)

def sqlite_loop():
    path = os.path.join(work, "db.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    try:
        assert db.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
        db.execute("PRAGMA synchronous = FULL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 64,))
            db.execute("COMMIT")
            n += 1
        return n / elapsed
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)

methods = [
    ("write+fdatasync", lambda: file_loop(os.fdatasync)),
    ("write+fsync", lambda: file_loop(os.fsync)),
    ("sqlite-wal", sqlite_loop),
]
results = {name: [] for name, _ in methods}
for _ in range(runs):
    for name, run in methods:
        results[name].append(run())
print(f"{'':16} {'min':>9} {'median':>9} {'max':>9}  commits/s  (median µs per commit)")
for name, rates in results.items():
    med = statistics.median(rates)
    print(f"{name:16} {min(rates):9.0f} {med:9.0f} {max(rates):9.0f}  ({1e6 / med:.0f} µs)")
PY

[ -n "${RECEIVER:-}" ] || exit 0
cd "$(dirname "$0")/.."
concurrency=${CONCURRENCY:-64}
command -v strace >/dev/null || { echo "bench/fsync.sh: RECEIVER needs strace" >&2; exit 1; }
cargo build --release --quiet --bin einmal --bin einmal-loadgen
for run in $(seq "$runs"); do
  data="$work/data-$run"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  RUST_LOG=warn strace -f -qq --seccomp-bpf -e trace=fsync,fdatasync -e signal=none -y \
    -o "$work/trace-$run" target/release/einmal serve --addr "127.0.0.1:$port" --data-dir "$data" --max-connections-per-peer "$peer_limit" 2>/dev/null &
  server=$!
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  before=$(grep -c 'einmal.sqlite-wal>' "$work/trace-$run" || true)
  out=$(target/release/einmal-loadgen --url "http://127.0.0.1:$port" --requests "$RECEIVER" \
    --concurrency "$concurrency" --duplicates 0.2 --body-bytes 3000 2>/dev/null)
  after=$(grep -c 'einmal.sqlite-wal>' "$work/trace-$run" || true)
  # Stop the server, not strace (strace then exits with it).
  kill $(pgrep -P "$server") 2>/dev/null || true; wait "$server" 2>/dev/null || true
  echo "run $run: ${out%%$'\n'*}"
  python3 - "$RECEIVER" "$before" "$after" "$work/trace-$run" <<'PY'
import collections, re, sys
requests, before, after, trace = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
wal = after - before
print(f"  einmal.sqlite-wal fsyncs during the load: {wal}: {requests / max(wal, 1):.1f} requests per fsync")
files = collections.Counter(m.group(1).rsplit("/", 1)[-1]
                            for m in re.finditer(r"\(\d+<([^>]*)>", open(trace).read()))
print("  all fsyncs of the run by file: " + ", ".join(f"{f} {n}" for f, n in files.most_common()))
PY
done
