//! The writer thread: every inbox and queue write, committed in groups, and the
//! background checkpointer that keeps the WAL short.
//!
//! # Durability and group commit
//!
//! The database runs in WAL mode with `synchronous=FULL`: a transaction is on disk
//! (the WAL is fsynced) before `COMMIT` returns. Every write (inbox insert, queue
//! send, receive, ack, visibility change) goes to one dedicated writer thread that
//! owns the write connection. The thread takes everything that is pending (up to
//! [`MAX_BATCH`] operations), runs it in one `BEGIN IMMEDIATE … COMMIT`, and only
//! then answers the callers: one fsync covers the whole batch. While it fsyncs, the
//! next batch accumulates, so throughput grows with concurrency and latency stays
//! about two commits long.
//!
//! Each operation in a batch runs inside its own savepoint: an operation that fails
//! is rolled back alone and gets its own error, the others commit. If the commit
//! itself fails, every caller of the batch gets `Unavailable` (and may retry: all
//! operations are idempotent or conditional).
//!
//! # Writes that need no fsync of their own
//!
//! Most writes are *durable* ([`EmbeddedStore::write`]): they are answered once
//! their transaction is committed with `synchronous=FULL` (fsynced). A few are
//! *ordered* ([`EmbeddedStore::write_ordered`]): the queue's send, receive,
//! visibility changes and deletes, and the processor's claim and finish of an inbox
//! item. Of what is pending, the writer commits the ordered writes first, with
//! `synchronous=NORMAL` (no fsync), answers them, then the durable ones in a second
//! transaction whose fsync covers both (it syncs the whole WAL file). Why that keeps
//! every guarantee:
//! - a process crash (`kill -9`) loses nothing either way: a commit is in the WAL
//!   (the OS page cache) before `COMMIT` returns;
//! - a power loss can lose only a *suffix* of the commits since the last fsync (WAL
//!   recovery stops at the first frame whose running checksum fails), i.e. it leaves
//!   exactly the store a crash right before the first lost commit would have left,
//!   which the pipeline already recovers from: an item stored but not enqueued is
//!   re-enqueued (at start and by the sweeper), a lost receive, claim, finish or
//!   delete means a redelivery, which claims and effect guards make harmless;
//! - what the world outside the store sees stays behind an fsync: the 2xx of a
//!   webhook (the inbox put is durable: "durably in the inbox"), an effect (the
//!   business commit is durable, before any destination hears of it), a finish that
//!   records deliveries to destinations (durable, before the relay hands on the
//!   object's next event).
//!
//! So a webhook waits for one fsync (its put; the send follows without), and a
//! processed batch for one (its business commits share it), and concurrent batches
//! and the receiver's puts share even that. [`EmbeddedStore::commit_stats`] counts
//! the commits and the fsynced ones.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::{schema, DbError, EmbeddedStore, BUSY_TIMEOUT};
use crate::ports::StoreError;

/// Most operations committed in one transaction.
pub(super) const MAX_BATCH: usize = 512;

/// The writer thread's connection: WAL, `synchronous=FULL`, schema brought up to date.
pub(super) fn open_writer(path: &Path) -> Result<Connection, DbError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Before anything writes the file's header: a new file becomes incremental (the
    // purge hands surplus free pages back); on an existing one this only takes effect
    // at its next VACUUM.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Unavailable(format!(
            "cannot switch {} to WAL (mode {mode})",
            path.display()
        )));
    }
    // FULL: the WAL is fsynced at every commit, so a committed batch survives power loss.
    // Checkpoints run on their own thread (`checkpoint_loop`) so that copying pages into
    // the database file and fsyncing it does not delay commits. The writer still
    // checkpoints itself when the WAL reaches 8192 pages (32 MiB): that is what lets the
    // WAL restart from its beginning under continuous load, and it is cheap because the
    // background checkpointer has already copied all but the last few milliseconds.
    // Reusing the WAL file in place also keeps each commit's fsync cheap (no file growth).
    // After a checkpoint the WAL file is truncated to 64 MiB if it grew past that.
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA wal_autocheckpoint = 8192;
         PRAGMA journal_size_limit = 67108864;
         PRAGMA cache_size = -32768;
         PRAGMA temp_store = MEMORY;",
    )?;
    schema::migrate(&conn, path)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

pub(super) fn open_checkpointer(path: &Path) -> Result<Connection, DbError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // The checkpoint fsyncs the database file before the WAL may be reused.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;")?;
    Ok(conn)
}

/// Pause between a commit and the background checkpoint that follows it. Short, so
/// that the writer's own checkpoint (see `open_writer`) finds almost nothing to copy;
/// measured against 30 ms, 100 ms and 1 s, 10 ms gave the best tail latency.
const CHECKPOINT_DELAY: Duration = Duration::from_millis(10);

/// Passive checkpoints on a dedicated connection after the writer committed: they
/// neither block the writer nor readers. Idle stores do no work.
pub(super) fn checkpoint_loop(conn: Connection, nudged: mpsc::Receiver<()>) {
    while nudged.recv().is_ok() {
        std::thread::sleep(CHECKPOINT_DELAY);
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
        {
            tracing::warn!(error = %e, "embedded store: checkpoint failed");
        }
    }
}

/// What the writer committed since the store was opened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions committed (one per batch of operations).
    pub commits: u64,
    /// Of those, the ones committed with `synchronous=FULL`: each fsyncs the WAL
    /// (at most; a batch that changed nothing writes no frame). The background
    /// checkpoints' fsyncs are not counted: no caller waits for them.
    pub fsynced: u64,
    /// Of the fsynced ones, those that carried at least one business commit (the
    /// processor's only write that waits for an fsync, unless it delivers to
    /// destinations): the processor's fsyncs.
    pub fsynced_effects: u64,
    /// Operations (jobs) in those transactions.
    pub operations: u64,
}

/// The writer thread's counters behind [`CommitStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    commits: AtomicU64,
    fsynced: AtomicU64,
    fsynced_effects: AtomicU64,
    operations: AtomicU64,
    /// The last batch met a write the disk refused (full, I/O error).
    disk_refused: std::sync::atomic::AtomicBool,
}

impl Counters {
    /// Record whether the last batch met a disk refusal; the first refusal and the
    /// recovery are logged once each.
    fn disk_refused(&self, refused: bool, error: Option<&DbError>) {
        let was = self.disk_refused.swap(refused, Ordering::Relaxed);
        match (was, refused) {
            (false, true) => tracing::error!(
                error = ?error,
                "embedded store: the disk refuses writes (full or I/O error): webhooks are \
                 answered 503 and processing pauses until space returns"
            ),
            (true, false) => {
                tracing::warn!("embedded store: writes succeed again; intake and processing resume")
            }
            _ => {}
        }
    }

    pub(super) fn snapshot(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            fsynced: self.fsynced.load(Ordering::Relaxed),
            fsynced_effects: self.fsynced_effects.load(Ordering::Relaxed),
            operations: self.operations.load(Ordering::Relaxed),
        }
    }
}

/// One write operation waiting for the next batch.
pub(super) trait Job: Send {
    /// Run inside the batch transaction. `false`: the operation failed and its
    /// writes must be rolled back.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Whether the caller may only hear of the commit once it is fsynced (see the
    /// module documentation for the writes that need not).
    fn durable(&self) -> bool;
    /// Whether it is a business commit (counted in [`CommitStats::fsynced_effects`]).
    fn effect(&self) -> bool;
    /// Answer the caller once the batch is over: `Ok` = committed.
    fn finish(self: Box<Self>, batch: Result<(), &DbError>);
    /// Its own failure, if the disk refused its write.
    fn disk_refused(&self) -> bool {
        false
    }
}

struct Op<T, F> {
    work: Option<F>,
    result: Option<Result<T, DbError>>,
    reply: oneshot::Sender<Result<T, DbError>>,
    durability: Durability,
}

/// How a write waits for the disk (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// Answered once committed; fsynced by the next durable commit.
    Ordered,
    /// Answered once committed and fsynced.
    Durable,
    /// A business commit: durable, and counted.
    Effect,
}

impl<T, F> Job for Op<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, DbError> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = work(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn durable(&self) -> bool {
        self.durability != Durability::Ordered
    }

    fn effect(&self) -> bool {
        self.durability == Durability::Effect
    }

    fn disk_refused(&self) -> bool {
        matches!(&self.result, Some(Err(e)) if e.is_disk_refusal())
    }

    fn finish(self: Box<Self>, batch: Result<(), &DbError>) {
        let this = *self;
        let answer = match (this.result, batch) {
            // The operation's own failure: its writes were rolled back, whatever the batch did.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(e)) => Err(e.clone()),
            (None, Ok(())) => Err(DbError::Unavailable("write was not executed".into())),
        };
        // The caller may have gone away (cancelled request); nothing to do then.
        let _ = this.reply.send(answer);
    }
}

pub(super) fn writer_loop(
    conn: Connection,
    rx: mpsc::Receiver<Box<dyn Job>>,
    checkpoint_nudge: mpsc::SyncSender<()>,
    counters: std::sync::Arc<Counters>,
) {
    let mut pending: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    let mut durable: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    // `open_writer` leaves the connection at FULL.
    let mut full = true;
    while let Ok(first) = rx.recv() {
        pending.push(first);
        while pending.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => pending.push(job),
                Err(_) => break,
            }
        }
        // Everything pending was submitted concurrently (no caller waits for another's
        // answer), so any order is a valid one: the ordered writes commit first without
        // an fsync and their callers go on at once; the durable ones follow in a
        // transaction whose fsync also covers the first.
        let mut i = 0;
        while i < pending.len() {
            if pending[i].durable() {
                durable.push(pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        let effects = durable.iter().any(|job| job.effect());
        for (batch, sync) in [(&mut pending, false), (&mut durable, true)] {
            if batch.is_empty() {
                continue;
            }
            if sync != full {
                // Outside any transaction, so it applies to the next COMMIT.
                let pragma = if sync {
                    "PRAGMA synchronous = FULL"
                } else {
                    "PRAGMA synchronous = NORMAL"
                };
                match exec(&conn, pragma) {
                    Ok(()) => full = sync,
                    Err(e) => {
                        tracing::error!(error = ?e, "embedded store: cannot set the sync mode")
                    }
                }
            }
            // A durable write never commits without its fsync: if the connection could
            // not be switched back to FULL, nobody of the batch is answered `Ok`.
            if sync && !full {
                let err = DbError::Unavailable("the store cannot fsync its commits".into());
                for job in batch.drain(..) {
                    job.finish(Err(&err));
                }
                continue;
            }
            counters
                .operations
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            // Counted before anyone is answered, so a caller reads its own commit.
            run_batch(&conn, batch, &counters, || {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                if full {
                    counters.fsynced.fetch_add(1, Ordering::Relaxed);
                    if effects && sync {
                        counters.fsynced_effects.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // Full: a checkpoint is already due. Disconnected: the checkpointer stopped,
        // the writer's own checkpoints still bound the WAL.
        let _ = checkpoint_nudge.try_send(());
    }
}

/// Run every job of `batch` in one transaction, commit once, call `committed` if it
/// did, answer everyone.
fn run_batch(
    conn: &Connection,
    batch: &mut Vec<Box<dyn Job>>,
    counters: &Counters,
    committed: impl FnOnce(),
) {
    let outcome = match catch_unwind(AssertUnwindSafe(|| execute_batch(conn, batch))) {
        Ok(outcome) => outcome,
        Err(_) => Err(DbError::Unavailable(
            "the store writer failed unexpectedly".into(),
        )),
    };
    if outcome.is_err() && !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::error!(error = %e, "embedded store: rollback failed");
        }
    }
    if let Err(e) = &outcome {
        tracing::warn!(error = ?e, ops = batch.len(), "embedded store: batch not committed");
    }
    if outcome.is_ok() {
        committed();
    }
    let refused = match &outcome {
        Err(e) => e.is_disk_refusal() || batch.iter().any(|job| job.disk_refused()),
        Ok(()) => batch.iter().any(|job| job.disk_refused()),
    };
    counters.disk_refused(refused, outcome.as_ref().err());
    for job in batch.drain(..) {
        job.finish(outcome.as_ref().map(|_| ()));
    }
}

fn execute_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), DbError> {
    exec(conn, "BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        exec(conn, "SAVEPOINT op")?;
        if job.run(conn) {
            exec(conn, "RELEASE op")?;
        } else {
            if conn.is_autocommit() {
                // SQLite aborted the whole transaction (I/O error, disk full, ...).
                let refused = job.disk_refused();
                return Err(DbError::Unavailable(format!(
                    "{}the batch transaction was aborted by a failed write",
                    if refused {
                        format!("{}: ", super::DISK_REFUSED)
                    } else {
                        String::new()
                    }
                )));
            }
            exec(conn, "ROLLBACK TO op")?;
            exec(conn, "RELEASE op")?;
        }
    }
    exec(conn, "COMMIT")
}

fn exec(conn: &Connection, sql: &str) -> Result<(), DbError> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

impl EmbeddedStore {
    /// Run `work` on the writer thread inside the next group-commit transaction;
    /// the result comes back after the transaction committed and was fsynced.
    pub(super) async fn write<T, F>(&self, work: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        self.submit(work, Durability::Durable).await
    }

    /// [`EmbeddedStore::write`] for a write that needs no fsync of its own: the
    /// result comes back once the transaction committed; the next durable commit
    /// fsyncs it (see the module documentation for which writes may).
    pub(super) async fn write_ordered<T, F>(&self, work: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        self.submit(work, Durability::Ordered).await
    }

    /// Queue `work` for the writer thread and wait for its answer.
    pub(super) async fn submit<T, F>(&self, work: F, durability: Durability) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Op {
            work: Some(work),
            result: None,
            reply,
            durability,
        });
        let writer = self
            .writer
            .as_ref()
            .ok_or_else(|| DbError::Unavailable("store is closed".into()))?;
        writer
            .send(job)
            .map_err(|_| DbError::Unavailable("the writer thread has stopped".into()))?;
        answer.await.map_err(|_| {
            DbError::Unavailable("the writer thread stopped before answering".into())
        })?
    }

    /// What the writer committed since the store was opened: commits, fsynced
    /// commits, operations.
    pub fn commit_stats(&self) -> CommitStats {
        self.counters.snapshot()
    }

    /// Whether the last write batch met a write the disk refused (full, I/O error):
    /// intake answers 503 meanwhile, processing pauses; cleared by the next batch that
    /// commits without one.
    pub fn writes_failing(&self) -> bool {
        self.counters.disk_refused.load(Ordering::Relaxed)
    }

    /// Cap the file at `pages` pages (`PRAGMA max_page_count` of the writer's
    /// connection); `None` lifts the cap. Writes that need more space fail as on a
    /// full disk. For tests of a full disk, and to keep a store from filling a disk
    /// shared with others.
    pub async fn limit_pages(&self, pages: Option<u64>) -> Result<u64, StoreError> {
        let pages = pages.map_or(u32::MAX as u64 - 1, |p| p.max(1));
        Ok(self
            .write(move |conn| {
                Ok(
                    conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                        r.get::<_, u64>(0)
                    })?,
                )
            })
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::adapters::embedded::inbox::put_item;
    use crate::adapters::embedded::item_row::get_item;
    use crate::adapters::embedded::tests::{item, msg, open};
    use crate::adapters::embedded::DB_FILE;
    use crate::ports::{Inbox, PutOutcome, Queue};
    use crate::time::now_millis;

    #[tokio::test]
    async fn a_failed_operation_does_not_fail_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join(DB_FILE)).unwrap();
        let a = item("p", "t", "a", 1);
        let b = item("p", "t", "b", 2);
        let (ta, ra) = oneshot::channel();
        let (tf, rf) = oneshot::channel();
        let (tb, rb) = oneshot::channel();
        let (a2, b2) = (a.clone(), b.clone());
        let failing = |conn: &Connection| -> Result<(), DbError> {
            conn.execute("INSERT INTO queue (body, visible_at_ms, receive_count, sent_at_ms) VALUES ('x', 0, 0, 0)", [])?;
            Err(DbError::Unavailable("boom".into()))
        };
        let mut batch: Vec<Box<dyn Job>> = vec![
            Box::new(Op {
                work: Some(move |c: &Connection| put_item(c, &a2)),
                result: None,
                reply: ta,
                durability: Durability::Durable,
            }),
            Box::new(Op {
                work: Some(failing),
                result: None,
                reply: tf,
                durability: Durability::Durable,
            }),
            Box::new(Op {
                work: Some(move |c: &Connection| put_item(c, &b2)),
                result: None,
                reply: tb,
                durability: Durability::Durable,
            }),
        ];
        run_batch(&conn, &mut batch, &Counters::default(), || {});
        assert!(batch.is_empty());
        assert_eq!(ra.await.unwrap(), Ok(PutOutcome::Inserted));
        assert_eq!(rf.await.unwrap(), Err(DbError::Unavailable("boom".into())));
        assert_eq!(rb.await.unwrap(), Ok(PutOutcome::Inserted));
        let queued: i64 = conn
            .query_row("SELECT count(*) FROM queue", [], |r| r.get(0))
            .unwrap();
        assert_eq!(queued, 0, "the failed operation's write was rolled back");
        assert_eq!(get_item(&conn, a.key.as_str()).unwrap(), Some(a));
        assert_eq!(get_item(&conn, b.key.as_str()).unwrap(), Some(b));
    }

    #[tokio::test]
    async fn a_failed_commit_fails_every_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join(DB_FILE)).unwrap();
        // A deferred foreign key violation only surfaces at COMMIT.
        conn.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let a = item("p", "t", "a", 1);
        let a2 = a.clone();
        let (ta, ra) = oneshot::channel();
        let (tf, rf) = oneshot::channel();
        let mut batch: Vec<Box<dyn Job>> = vec![
            Box::new(Op {
                work: Some(move |c: &Connection| put_item(c, &a2)),
                result: None,
                reply: ta,
                durability: Durability::Durable,
            }),
            Box::new(Op {
                work: Some(|c: &Connection| -> Result<(), DbError> {
                    c.execute("INSERT INTO child (pid) VALUES (7)", [])?;
                    Ok(())
                }),
                result: None,
                reply: tf,
                durability: Durability::Durable,
            }),
        ];
        run_batch(&conn, &mut batch, &Counters::default(), || {});
        assert!(matches!(ra.await.unwrap(), Err(DbError::Unavailable(_))));
        assert!(matches!(rf.await.unwrap(), Err(DbError::Unavailable(_))));
        assert!(conn.is_autocommit());
        assert_eq!(get_item(&conn, a.key.as_str()).unwrap(), None);
    }

    #[tokio::test]
    async fn a_panicking_write_is_unavailable_and_the_store_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let result = store
            .write(|_| -> Result<(), DbError> { panic!("bug in a write") })
            .await;
        assert!(matches!(result, Err(DbError::Unavailable(_))));
        let a = item("p", "t", "after", 1);
        assert_eq!(store.put_new(&a).await.unwrap(), PutOutcome::Inserted);
    }

    /// Throughput sanity check: `cargo test --release -p einmal-shared --lib
    /// adapters::embedded::writer::tests::throughput -- --ignored --nocapture`
    /// (EINMAL_BENCH_TASKS, EINMAL_BENCH_WEBHOOKS to vary the load).
    #[test]
    #[ignore]
    fn throughput() {
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let tasks = env("EINMAL_BENCH_TASKS", 32);
        let total = env("EINMAL_BENCH_WEBHOOKS", 20_000);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(open(dir.path()));
            let body = crate::body::compress(&br#"{"id":"evt","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount":1000,"currency":"eur"}}}"#.repeat(8)).unwrap();
            let start = std::time::Instant::now();
            let mut handles = Vec::new();
            for t in 0..tasks {
                let store = store.clone();
                let body = body.clone();
                handles.push(tokio::spawn(async move {
                    let mut lat = Vec::new();
                    for i in 0..total / tasks {
                        let mut it = item("stripe", "acme", &format!("evt_{t}_{i}"), now_millis());
                        it.body = body.clone();
                        let t0 = std::time::Instant::now();
                        assert_eq!(store.put_new(&it).await.unwrap(), PutOutcome::Inserted);
                        store.send(&msg(&it)).await.unwrap();
                        lat.push(t0.elapsed());
                    }
                    lat
                }));
            }
            let mut lat = Vec::new();
            for h in handles {
                lat.extend(h.await.unwrap());
            }
            let elapsed = start.elapsed();
            let stats = store.commit_stats();
            let (batches, ops) = (stats.commits, stats.operations);
            let wal = std::fs::metadata(dir.path().join(format!("{DB_FILE}-wal"))).map(|m| m.len()).unwrap_or(0);
            let db = std::fs::metadata(store.path()).map(|m| m.len()).unwrap_or(0);
            println!(
                "{batches} commits, {:.1} ops per commit; database {} KiB, WAL {} KiB",
                ops as f64 / batches.max(1) as f64,
                db / 1024,
                wal / 1024
            );
            lat.sort();
            let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
            println!(
                "{} webhooks (put_new+send) from {tasks} tasks in {elapsed:?}: {:.0} webhooks/s, latency p50 {:?} p99 {:?} max {:?}",
                lat.len(),
                lat.len() as f64 / elapsed.as_secs_f64(),
                pct(0.50),
                pct(0.99),
                lat[lat.len() - 1]
            );
        });
    }
}
