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
#   bench/fsync.sh [seconds] [runs] [dir]   (dir: default a fresh temp dir, like the
#                                             benchmarks' data dirs)
set -euo pipefail
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
