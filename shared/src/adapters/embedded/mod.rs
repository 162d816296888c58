//! Embedded adapter: the inbox and the work queue in one SQLite file.
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
//! Reads (`get`, `list`) use a small pool of separate connections; WAL lets them
//! run while the writer commits. A read that starts after a write returned sees it.
//!
//! # Queue semantics (SQS)
//!
//! `receive` delivers visible messages, bumps their receive count, hands out a fresh
//! receipt and hides them for the visibility timeout. A message whose receive count
//! already reached `max_receive_count` is moved to the `dead_letter` table on the
//! next receive attempt instead of being delivered (SQS redrive); it keeps its
//! receive count, as SQS does. Only the latest receipt of a message is valid: `ack`
//! or `change_visibility` with a stale receipt is a no-op. `send` also moves the
//! inbox item from `received` to `queued` in the same transaction.

mod hints;
mod replay;
pub(crate) mod state;
mod waiting;

pub use state::EmbeddedStateStore;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::oneshot;

use crate::envelope::{Envelope, InboxKey};
use crate::ports::InboxSweep;
use crate::ports::{
    ClaimOutcome, Delivery, Finish, Inbox, InboxFilter, InboxItem, InboxProcessing, InboxState,
    PutOutcome, Queue, QueueError, QueueMessage, Source, StoreError, WaitChange, Waiting,
    WaitingScan,
};
use crate::time::now_millis;

/// File name of the database inside the store directory.
pub const DB_FILE: &str = "einmal.sqlite";

/// Most operations committed in one transaction.
pub const MAX_BATCH: usize = 512;

/// `list` limit when the filter says 0.
const DEFAULT_LIST_LIMIT: usize = 100;
/// Idle read connections kept open.
const MAX_IDLE_READERS: usize = 4;
/// How long a connection waits for a lock held by another process (e.g. the CLI).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of the embedded store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// Receives allowed per message before the next receive attempt moves it to
    /// the dead-letter table (SQS `maxReceiveCount`).
    pub max_receive_count: u32,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            max_receive_count: 5,
        }
    }
}

/// Inbox and queue in one SQLite file (`dir/einmal.sqlite`). Implements both
/// [`Inbox`] and [`Queue`]; share it as `Arc<EmbeddedStore>`.
pub struct EmbeddedStore {
    path: PathBuf,
    writer: Option<mpsc::Sender<Box<dyn Job>>>,
    writer_thread: Option<JoinHandle<()>>,
    checkpointer_thread: Option<JoinHandle<()>>,
    readers: Arc<Readers>,
    max_receive_count: u32,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .field("max_receive_count", &self.max_receive_count)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Open (or create) the store in `dir`, creating the directory if needed.
    ///
    /// `max_receive_count` 0 is treated as 1.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
        })?;
        let path = dir.join(DB_FILE);
        let conn = open_writer(&path).map_err(StoreError::from)?;
        let checkpoint_conn = open_checkpointer(&path).map_err(StoreError::from)?;
        // The writer nudges the checkpointer after commits; when the writer stops, the
        // nudge channel closes and the checkpointer stops too.
        let (nudge, nudged) = mpsc::sync_channel::<()>(1);
        let checkpointer_thread = std::thread::Builder::new()
            .name("einmal-sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, nudged))
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}"))
            })?;
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let writer_thread = std::thread::Builder::new()
            .name("einmal-sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx, nudge))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the writer thread: {e}")))?;
        Ok(EmbeddedStore {
            readers: Arc::new(Readers {
                path: path.clone(),
                idle: Mutex::new(Vec::new()),
            }),
            path,
            writer: Some(tx),
            writer_thread: Some(writer_thread),
            checkpointer_thread: Some(checkpointer_thread),
            max_receive_count: options.max_receive_count.max(1),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `work` on the writer thread inside the next group-commit transaction;
    /// the result comes back after the transaction committed.
    async fn write<T, F>(&self, work: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Op {
            work: Some(work),
            result: None,
            reply,
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

    /// Run `work` on a read connection, off the async worker threads when a tokio
    /// runtime is present.
    async fn read<T, F>(&self, work: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        let readers = self.readers.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(move || readers.with(work))
                .await
                .map_err(|e| DbError::Unavailable(format!("read task failed: {e}")))?,
            Err(_) => readers.with(work),
        }
    }
}

impl Drop for EmbeddedStore {
    /// Stop the writer after it finished what was already submitted, then the
    /// checkpointer.
    fn drop(&mut self) {
        drop(self.writer.take());
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
        if let Some(thread) = self.checkpointer_thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------
// Errors

#[derive(Debug, Clone, PartialEq, Eq)]
enum DbError {
    Unavailable(String),
    Corrupt(String),
    Malformed(String),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        match e {
            E::FromSqlConversionFailure(..)
            | E::InvalidColumnType(..)
            | E::IntegralValueOutOfRange(..)
            | E::Utf8Error(..) => DbError::Corrupt(e.to_string()),
            other => DbError::Unavailable(other.to_string()),
        }
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(m) => StoreError::Unavailable(m),
            DbError::Corrupt(m) | DbError::Malformed(m) => StoreError::Corrupt(m),
        }
    }
}

impl From<DbError> for QueueError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(m) => QueueError::Unavailable(m),
            DbError::Corrupt(m) | DbError::Malformed(m) => QueueError::Malformed(m),
        }
    }
}

// ---------------------------------------------------------------------------
// Connections and schema

/// Stored in `PRAGMA user_version`. Version 2 added the processing columns (lease,
/// error class, result); a version 1 file is upgraded in place on open.
const SCHEMA_VERSION: i64 = 2;

/// Version 1 -> 2.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE inbox ADD COLUMN last_error_class TEXT;
ALTER TABLE inbox ADD COLUMN lease_until_ms INTEGER;
ALTER TABLE inbox ADD COLUMN lease_owner TEXT;
ALTER TABLE inbox ADD COLUMN result TEXT;
";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    pk             TEXT PRIMARY KEY NOT NULL,
    provider       TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    event_type     TEXT NOT NULL,
    object_id      TEXT,
    object_version TEXT,
    occurred_at    INTEGER,
    delivery_id    TEXT,
    state          TEXT NOT NULL,
    source         TEXT NOT NULL,
    attempts       INTEGER NOT NULL,
    received_at_ms INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    enqueue_failed INTEGER NOT NULL,
    last_error     TEXT,
    body_encoding  TEXT NOT NULL,
    body_len       INTEGER NOT NULL,
    body           BLOB NOT NULL,
    last_error_class TEXT,
    lease_until_ms INTEGER,
    lease_owner    TEXT,
    result         TEXT
);
CREATE INDEX IF NOT EXISTS inbox_by_state ON inbox(state, received_at_ms);
CREATE INDEX IF NOT EXISTS inbox_by_received ON inbox(received_at_ms);
CREATE TABLE IF NOT EXISTS queue (
    id            INTEGER PRIMARY KEY,
    body          TEXT NOT NULL,
    visible_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    receipt       TEXT,
    sent_at_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_by_visible ON queue(visible_at_ms);
CREATE TABLE IF NOT EXISTS dead_letter (
    id            INTEGER PRIMARY KEY,
    body          TEXT NOT NULL,
    visible_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    receipt       TEXT,
    sent_at_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS dead_letter_by_visible ON dead_letter(visible_at_ms);
";

fn open_writer(path: &Path) -> Result<Connection, DbError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
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
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    match version {
        SCHEMA_VERSION => {}
        0 => conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?,
        1 => conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {MIGRATE_1_TO_2} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?,
        other => {
            return Err(DbError::Unavailable(format!(
                "{} has schema version {other}, this build knows {SCHEMA_VERSION}",
                path.display()
            )))
        }
    }
    // Idempotent: also added to files created before the sweeper existed.
    conn.execute_batch(SWEEP_INDEX)?;
    // Idempotent too: the reconciler's partial index of GoPay / Klarna push hints.
    conn.execute_batch(&hints::hint_index_sql())?;
    // Idempotent too: the waiting columns and the waiters' partial index.
    waiting::ensure_waiting_columns(&conn)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn open_reader(path: &Path) -> Result<Connection, DbError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch("PRAGMA query_only = ON; PRAGMA cache_size = -8192;")?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

fn open_checkpointer(path: &Path) -> Result<Connection, DbError> {
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
fn checkpoint_loop(conn: Connection, nudged: mpsc::Receiver<()>) {
    while nudged.recv().is_ok() {
        std::thread::sleep(CHECKPOINT_DELAY);
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
        {
            tracing::warn!(error = %e, "embedded store: checkpoint failed");
        }
    }
}

/// A few idle read connections; more are opened on demand.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn with<T>(&self, work: impl FnOnce(&Connection) -> Result<T, DbError>) -> Result<T, DbError> {
        let pooled = self
            .idle
            .lock()
            .map_err(|_| DbError::Unavailable("read pool lock poisoned".into()))?
            .pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&self.path)?,
        };
        let result = work(&conn);
        if conn.is_autocommit() {
            if let Ok(mut idle) = self.idle.lock() {
                if idle.len() < MAX_IDLE_READERS {
                    idle.push(conn);
                }
            }
        }
        result
    }
}

// ---------------------------------------------------------------------------
// The writer thread and group commit

/// One write operation waiting for the next batch.
trait Job: Send {
    /// Run inside the batch transaction. `false`: the operation failed and its
    /// writes must be rolled back.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller once the batch is over: `Ok` = committed.
    fn finish(self: Box<Self>, batch: Result<(), &DbError>);
}

struct Op<T, F> {
    work: Option<F>,
    result: Option<Result<T, DbError>>,
    reply: oneshot::Sender<Result<T, DbError>>,
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

fn writer_loop(
    conn: Connection,
    rx: mpsc::Receiver<Box<dyn Job>>,
    checkpoint_nudge: mpsc::SyncSender<()>,
) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(&conn, &mut batch);
        // Full: a checkpoint is already due. Disconnected: the checkpointer stopped,
        // the writer's own checkpoints still bound the WAL.
        let _ = checkpoint_nudge.try_send(());
    }
}

/// Run every job of `batch` in one transaction, commit once, answer everyone.
fn run_batch(conn: &Connection, batch: &mut Vec<Box<dyn Job>>) {
    #[cfg(test)]
    {
        tests::BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tests::OPS.fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
    }
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
                return Err(DbError::Unavailable(
                    "the batch transaction was aborted by a failed write".into(),
                ));
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

// ---------------------------------------------------------------------------
// Inbox

const ITEM_COLUMNS: &str =
    "pk, provider, tenant, event_id, event_type, object_id, object_version, \
     occurred_at, delivery_id, state, source, attempts, received_at_ms, updated_at_ms, expires_at, \
     enqueue_failed, last_error, body_encoding, body_len, body, last_error_class, lease_until_ms, \
     lease_owner, result, wait_on, waiting_since_ms";

const INSERT_ITEM: &str = "INSERT INTO inbox (pk, provider, tenant, event_id, event_type, object_id, \
     object_version, occurred_at, delivery_id, state, source, attempts, received_at_ms, updated_at_ms, \
     expires_at, enqueue_failed, last_error, body_encoding, body_len, body, last_error_class, \
     lease_until_ms, lease_owner, result) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, \
     ?21, ?22, ?23, ?24) \
     ON CONFLICT(pk) DO NOTHING";

fn get_item(conn: &Connection, pk: &str) -> Result<Option<InboxItem>, DbError> {
    let sql = format!("SELECT {ITEM_COLUMNS} FROM inbox WHERE pk = ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([pk])?;
    match rows.next()? {
        Some(row) => Ok(Some(item_from_row(row)?)),
        None => Ok(None),
    }
}

fn item_from_row(row: &Row<'_>) -> Result<InboxItem, DbError> {
    let pk: String = row.get(0)?;
    let state: String = row.get(9)?;
    let source: String = row.get(10)?;
    let attempts: i64 = row.get(11)?;
    let body_len: i64 = row.get(18)?;
    Ok(InboxItem {
        envelope: Envelope {
            provider: row.get(1)?,
            tenant: row.get(2)?,
            event_id: row.get(3)?,
            event_type: row.get(4)?,
            object_id: row.get(5)?,
            object_version: row.get(6)?,
            occurred_at: row.get(7)?,
            delivery_id: row.get(8)?,
        },
        state: InboxState::parse(&state)
            .ok_or_else(|| DbError::Corrupt(format!("inbox item {pk}: unknown state {state:?}")))?,
        source: Source::parse(&source).ok_or_else(|| {
            DbError::Corrupt(format!("inbox item {pk}: unknown source {source:?}"))
        })?,
        attempts: u32::try_from(attempts).map_err(|_| {
            DbError::Corrupt(format!("inbox item {pk}: attempts {attempts} out of range"))
        })?,
        received_at_ms: row.get(12)?,
        updated_at_ms: row.get(13)?,
        expires_at: row.get(14)?,
        enqueue_failed: row.get::<_, i64>(15)? != 0,
        last_error: row.get(16)?,
        body_encoding: row.get(17)?,
        body_len: u64::try_from(body_len).map_err(|_| {
            DbError::Corrupt(format!("inbox item {pk}: body_len {body_len} out of range"))
        })?,
        body: row.get(19)?,
        last_error_class: row.get(20)?,
        lease_until_ms: row.get(21)?,
        lease_owner: row.get(22)?,
        result: row.get(23)?,
        waiting: match (
            row.get::<_, Option<String>>(24)?,
            row.get::<_, Option<i64>>(25)?,
        ) {
            (Some(on), Some(since_ms)) => Some(Waiting { on, since_ms }),
            _ => None,
        },
        key: InboxKey::from_stored(pk),
    })
}

fn put_item(conn: &Connection, item: &InboxItem) -> Result<PutOutcome, DbError> {
    let e = &item.envelope;
    let body_len = i64::try_from(item.body_len)
        .map_err(|_| DbError::Unavailable(format!("body_len {} out of range", item.body_len)))?;
    let inserted = conn.prepare_cached(INSERT_ITEM)?.execute(params![
        item.key.as_str(),
        e.provider,
        e.tenant,
        e.event_id,
        e.event_type,
        e.object_id,
        e.object_version,
        e.occurred_at,
        e.delivery_id,
        item.state.as_str(),
        item.source.as_str(),
        i64::from(item.attempts),
        item.received_at_ms,
        item.updated_at_ms,
        item.expires_at,
        i64::from(item.enqueue_failed),
        item.last_error,
        item.body_encoding,
        body_len,
        item.body,
        item.last_error_class,
        item.lease_until_ms,
        item.lease_owner,
        item.result,
    ])?;
    if inserted == 1 {
        return Ok(PutOutcome::Inserted);
    }
    match get_item(conn, item.key.as_str())? {
        Some(existing) => Ok(PutOutcome::Duplicate(Box::new(existing))),
        None => Err(DbError::Unavailable(format!(
            "insert of {} neither applied nor conflicted",
            item.key
        ))),
    }
}

fn list_items(conn: &Connection, filter: &InboxFilter) -> Result<Vec<InboxItem>, DbError> {
    let mut conditions: Vec<&str> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    if let Some(state) = filter.state {
        conditions.push("state = ?");
        args.push(state.as_str().to_string());
    }
    if let Some(provider) = &filter.provider {
        conditions.push("provider = ?");
        args.push(provider.clone());
    }
    if let Some(tenant) = &filter.tenant {
        conditions.push("tenant = ?");
        args.push(tenant.clone());
    }
    let mut sql = format!("SELECT {ITEM_COLUMNS} FROM inbox");
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" ORDER BY received_at_ms DESC, rowid DESC LIMIT ?");
    let limit = if filter.limit == 0 {
        DEFAULT_LIST_LIMIT
    } else {
        filter.limit
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);

    let mut stmt = conn.prepare_cached(&sql)?;
    let mut bound: Vec<&dyn rusqlite::ToSql> =
        args.iter().map(|a| a as &dyn rusqlite::ToSql).collect();
    bound.push(&limit);
    let mut rows = stmt.query(bound.as_slice())?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(item_from_row(row)?);
    }
    Ok(items)
}

#[async_trait]
impl Inbox for EmbeddedStore {
    async fn put_new(&self, item: &InboxItem) -> Result<PutOutcome, StoreError> {
        let item = item.clone();
        Ok(self.write(move |conn| put_item(conn, &item)).await?)
    }

    async fn get(&self, key: &InboxKey) -> Result<Option<InboxItem>, StoreError> {
        let pk = key.as_str().to_string();
        Ok(self.read(move |conn| get_item(conn, &pk)).await?)
    }

    async fn list(&self, filter: &InboxFilter) -> Result<Vec<InboxItem>, StoreError> {
        let filter = filter.clone();
        Ok(self.read(move |conn| list_items(conn, &filter)).await?)
    }

    /// Sets the flag only while the item is `received`; `updated_at_ms` is left alone
    /// (it tracks state changes). A missing key is not an error.
    async fn mark_enqueue_failed(&self, key: &InboxKey) -> Result<(), StoreError> {
        let pk = key.as_str().to_string();
        self.write(move |conn| {
            conn.prepare_cached(
                "UPDATE inbox SET enqueue_failed = 1 WHERE pk = ?1 AND state = 'received'",
            )?
            .execute([&pk])?;
            Ok(())
        })
        .await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Processing (claim / finish under a lease)

/// Claim: the item is waiting, or held by a lease that ran out (`?4` = now). The
/// condition sits in the WHERE clause and the row comes back through RETURNING: one
/// statement, inside the writer's transaction.
const CLAIM_ITEM: &str = "UPDATE inbox SET state = 'processing', lease_owner = ?2, \
     lease_until_ms = ?3, updated_at_ms = ?4, attempts = attempts + 1 \
     WHERE pk = ?1 AND (state IN ('received', 'queued', 'retryable', 'waiting') \
     OR (state = 'processing' AND (lease_until_ms IS NULL OR lease_until_ms <= ?4)))";

const FINISH_ITEM: &str = "UPDATE inbox SET state = ?3, updated_at_ms = ?4, \
     last_error_class = COALESCE(?5, last_error_class), last_error = COALESCE(?6, last_error), \
     result = COALESCE(?7, result), lease_owner = NULL, lease_until_ms = NULL, \
     wait_on = CASE ?8 WHEN 1 THEN ?9 WHEN 2 THEN NULL ELSE wait_on END, \
     waiting_since_ms = CASE ?8 WHEN 1 THEN ?10 WHEN 2 THEN NULL ELSE waiting_since_ms END \
     WHERE pk = ?1 AND state = 'processing' AND lease_owner = ?2";

const MARK_DEAD_LETTER: &str = "UPDATE inbox SET state = 'dead_letter', last_error = ?2, \
     updated_at_ms = ?3, lease_owner = NULL, lease_until_ms = NULL, wait_on = NULL, \
     waiting_since_ms = NULL \
     WHERE pk = ?1 AND (state IN ('received', 'queued', 'retryable', 'waiting') \
     OR (state = 'processing' AND (lease_until_ms IS NULL OR lease_until_ms <= ?3)))";

fn claim_item(
    conn: &Connection,
    pk: &str,
    owner: &str,
    now_ms: i64,
    lease_ms: i64,
) -> Result<ClaimOutcome, DbError> {
    let sql = format!("{CLAIM_ITEM} RETURNING {ITEM_COLUMNS}");
    let claimed = {
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![pk, owner, now_ms.saturating_add(lease_ms), now_ms])?;
        match rows.next()? {
            Some(row) => Some(item_from_row(row)?),
            None => None,
        }
    };
    if let Some(item) = claimed {
        return Ok(ClaimOutcome::Claimed(Box::new(item)));
    }
    // Why not, read in the same transaction.
    let found: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT state, lease_until_ms FROM inbox WHERE pk = ?1")?
        .query_row([pk], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((state, lease_until_ms)) = found else {
        return Ok(ClaimOutcome::Missing);
    };
    let state = InboxState::parse(&state)
        .ok_or_else(|| DbError::Corrupt(format!("inbox item {pk}: unknown state {state:?}")))?;
    match (state, lease_until_ms) {
        (s, _) if s.is_terminal() => Ok(ClaimOutcome::Finished(s)),
        (InboxState::Processing, Some(until_ms)) => Ok(ClaimOutcome::Leased { until_ms }),
        (s, _) => Err(DbError::Corrupt(format!(
            "inbox item {pk}: claim refused in state {s}"
        ))),
    }
}

fn finish_item(conn: &Connection, pk: &str, owner: &str, f: &Finish) -> Result<bool, DbError> {
    let (wait_mode, wait_on, since_ms) = match &f.wait {
        WaitChange::Keep => (0, None, None),
        WaitChange::Park(w) => (1, Some(w.on.as_str()), Some(w.since_ms)),
        WaitChange::Clear => (2, None, None),
    };
    let changed = conn.prepare_cached(FINISH_ITEM)?.execute(params![
        pk,
        owner,
        f.state.as_str(),
        f.now_ms,
        f.error_class,
        f.error,
        f.result,
        wait_mode,
        wait_on,
        since_ms,
    ])?;
    Ok(changed == 1)
}

#[async_trait]
impl InboxProcessing for EmbeddedStore {
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        Ok(self
            .write(move |conn| claim_item(conn, &pk, &owner, now_ms, lease_ms))
            .await?)
    }

    async fn finish(
        &self,
        key: &InboxKey,
        owner: &str,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        let finish = finish.clone();
        Ok(self
            .write(move |conn| finish_item(conn, &pk, &owner, &finish))
            .await?)
    }

    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let pk = key.as_str().to_string();
        let reason = reason.to_string();
        self.write(move |conn| {
            conn.prepare_cached(MARK_DEAD_LETTER)?
                .execute(params![pk, reason, now_ms])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        let record_pk = record_pk.to_string();
        Ok(self
            .read(move |conn| waiting::waiters_of(conn, &record_pk, limit))
            .await?)
    }
}

// ---------------------------------------------------------------------------
// Queue

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Queue,
    DeadLetter,
}

impl Table {
    fn receipt_tag(self) -> &'static str {
        match self {
            Table::Queue => "q",
            Table::DeadLetter => "d",
        }
    }

    fn select_visible(self) -> &'static str {
        match self {
            Table::Queue => {
                "SELECT id, body, receive_count FROM queue WHERE visible_at_ms <= ?1 \
                 ORDER BY visible_at_ms, id LIMIT ?2"
            }
            Table::DeadLetter => {
                "SELECT id, body, receive_count FROM dead_letter WHERE visible_at_ms <= ?1 \
                 ORDER BY visible_at_ms, id LIMIT ?2"
            }
        }
    }

    fn mark_received(self) -> &'static str {
        match self {
            Table::Queue => {
                "UPDATE queue SET receive_count = receive_count + 1, receipt = ?2, visible_at_ms = ?3 WHERE id = ?1"
            }
            Table::DeadLetter => {
                "UPDATE dead_letter SET receive_count = receive_count + 1, receipt = ?2, visible_at_ms = ?3 \
                 WHERE id = ?1"
            }
        }
    }

    fn delete(self) -> &'static str {
        match self {
            Table::Queue => "DELETE FROM queue WHERE id = ?1 AND receipt = ?2",
            Table::DeadLetter => "DELETE FROM dead_letter WHERE id = ?1 AND receipt = ?2",
        }
    }

    fn change_visibility(self) -> &'static str {
        match self {
            Table::Queue => "UPDATE queue SET visible_at_ms = ?3 WHERE id = ?1 AND receipt = ?2",
            Table::DeadLetter => {
                "UPDATE dead_letter SET visible_at_ms = ?3 WHERE id = ?1 AND receipt = ?2"
            }
        }
    }
}

/// A parsed receipt: `<table tag>.<row id>.<random>`.
struct Receipt {
    table: Table,
    id: i64,
}

fn new_receipt(table: Table, id: i64) -> String {
    format!(
        "{}.{id}.{:032x}",
        table.receipt_tag(),
        rand::random::<u128>()
    )
}

fn parse_receipt(receipt: &str) -> Result<Receipt, DbError> {
    let malformed =
        || DbError::Malformed(format!("receipt {receipt:?} was not issued by this store"));
    let mut parts = receipt.splitn(3, '.');
    let table = match parts.next() {
        Some("q") => Table::Queue,
        Some("d") => Table::DeadLetter,
        _ => return Err(malformed()),
    };
    let id = parts
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(malformed)?;
    match parts.next() {
        Some(nonce) if !nonce.is_empty() => Ok(Receipt { table, id }),
        _ => Err(malformed()),
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn send_message(conn: &Connection, message: &QueueMessage, body: &str) -> Result<(), DbError> {
    let now = now_millis();
    conn.prepare_cached(
        "INSERT INTO queue (body, visible_at_ms, receive_count, receipt, sent_at_ms) VALUES (?1, ?2, 0, NULL, ?2)",
    )?
    .execute(params![body, now])?;
    conn.prepare_cached("UPDATE inbox SET state = 'queued', updated_at_ms = ?2 WHERE pk = ?1 AND state = 'received'")?
        .execute(params![message.pk.as_str(), now])?;
    Ok(())
}

/// Move a queue row to the dead-letter table, keeping its body, receive count and
/// send time; it is visible there at once.
fn redrive(conn: &Connection, id: i64, now: i64) -> Result<(), DbError> {
    conn.prepare_cached(
        "INSERT INTO dead_letter (body, visible_at_ms, receive_count, receipt, sent_at_ms) \
         SELECT body, ?2, receive_count, NULL, sent_at_ms FROM queue WHERE id = ?1",
    )?
    .execute(params![id, now])?;
    conn.prepare_cached("DELETE FROM queue WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

fn receive_messages(
    conn: &Connection,
    table: Table,
    max: u32,
    visibility: Duration,
    max_receive_count: u32,
) -> Result<Vec<Delivery>, DbError> {
    let max = max as usize;
    let now = now_millis();
    let visible_at = now.saturating_add(millis(visibility));
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut delivered: HashSet<i64> = HashSet::new();
    loop {
        // With a zero visibility, rows delivered in an earlier round are visible
        // again: ask for enough rows to skip them.
        let want = max - deliveries.len() + delivered.len();
        let rows: Vec<(i64, String, i64)> = {
            let mut stmt = conn.prepare_cached(table.select_visible())?;
            let rows = stmt
                .query_map(params![now, i64::try_from(want).unwrap_or(i64::MAX)], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            rows.collect::<Result<_, _>>()?
        };
        let exhausted = rows.len() < want;
        let mut redriven = 0usize;
        for (id, body, count) in rows {
            if deliveries.len() >= max {
                break;
            }
            if delivered.contains(&id) {
                continue;
            }
            let message = match serde_json::from_str::<QueueMessage>(&body) {
                Ok(message) => Some(message),
                Err(e) => {
                    tracing::error!(table = ?table, id, error = %e, "embedded queue: undecodable message");
                    None
                }
            };
            if table == Table::Queue && (message.is_none() || count >= i64::from(max_receive_count))
            {
                redrive(conn, id, now)?;
                redriven += 1;
                continue;
            }
            let receipt = new_receipt(table, id);
            conn.prepare_cached(table.mark_received())?
                .execute(params![id, receipt, visible_at])?;
            let Some(message) = message else {
                // An undecodable dead letter: hidden like a delivered one so it does not
                // block the others, left in place for inspection.
                continue;
            };
            let receive_count = u32::try_from(count.saturating_add(1)).map_err(|_| {
                DbError::Corrupt(format!(
                    "{table:?} message {id}: receive count {count} out of range"
                ))
            })?;
            delivered.insert(id);
            deliveries.push(Delivery {
                message,
                receipt,
                receive_count,
            });
        }
        if deliveries.len() >= max || exhausted || redriven == 0 {
            return Ok(deliveries);
        }
    }
}

fn change_visibility_of(
    conn: &Connection,
    receipt: &Receipt,
    raw: &str,
    visible_at: i64,
) -> Result<(), DbError> {
    conn.prepare_cached(receipt.table.change_visibility())?
        .execute(params![receipt.id, raw, visible_at])?;
    Ok(())
}

impl EmbeddedStore {
    async fn receive_from(
        &self,
        table: Table,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let max_receive_count = self.max_receive_count;
        Ok(self
            .write(move |conn| receive_messages(conn, table, max, visibility, max_receive_count))
            .await?)
    }
}

#[async_trait]
impl Queue for EmbeddedStore {
    /// Enqueue, and move the inbox item from `received` to `queued` in the same transaction.
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let body =
            serde_json::to_string(message).map_err(|e| QueueError::Malformed(e.to_string()))?;
        let message = message.clone();
        Ok(self
            .write(move |conn| send_message(conn, &message, &body))
            .await?)
    }

    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(Table::Queue, max, visibility).await
    }

    /// Straight into the dead-letter table, visible there at once.
    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let body =
            serde_json::to_string(message).map_err(|e| QueueError::Malformed(e.to_string()))?;
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO dead_letter (body, visible_at_ms, receive_count, receipt, sent_at_ms) \
                 VALUES (?1, ?2, 0, NULL, ?2)",
            )?
            .execute(params![body, now_millis()])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// A stale receipt (the message was received again since) deletes nothing.
    async fn ack(&self, receipt: &str) -> Result<(), QueueError> {
        let parsed = parse_receipt(receipt)?;
        let raw = receipt.to_string();
        self.write(move |conn| {
            conn.prepare_cached(parsed.table.delete())?
                .execute(params![parsed.id, raw])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// A stale receipt changes nothing.
    async fn change_visibility(
        &self,
        receipt: &str,
        visibility: Duration,
    ) -> Result<(), QueueError> {
        let parsed = parse_receipt(receipt)?;
        let raw = receipt.to_string();
        self.write(move |conn| {
            let visible_at = now_millis().saturating_add(millis(visibility));
            change_visibility_of(conn, &parsed, &raw, visible_at)
        })
        .await?;
        Ok(())
    }

    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(Table::DeadLetter, max, visibility).await
    }
}

// ---------------------------------------------------------------------------
// Sweeper (stuck items, dead letters made visible again)

/// The sweeper's index: per state, oldest update first.
const SWEEP_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS inbox_by_state_updated ON inbox(state, updated_at_ms);";

/// One indexed range per state; a `processing` item's lease starts at its last
/// update, so `updated_at_ms < ?1` holds whenever the lease ran out before `?1`.
fn stuck_items(
    conn: &Connection,
    older_than_ms: i64,
    limit: usize,
) -> Result<Vec<InboxItem>, DbError> {
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut items = Vec::new();
    for state in [
        InboxState::Received,
        InboxState::Queued,
        InboxState::Retryable,
        InboxState::Processing,
    ] {
        let lease = if state == InboxState::Processing {
            " AND (lease_until_ms IS NULL OR lease_until_ms < ?2)"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {ITEM_COLUMNS} FROM inbox INDEXED BY inbox_by_state_updated \
             WHERE state = ?1 AND updated_at_ms < ?2{lease} ORDER BY updated_at_ms LIMIT ?3"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![state.as_str(), older_than_ms, limit_sql])?;
        while let Some(row) = rows.next()? {
            items.push(item_from_row(row)?);
        }
    }
    items.sort_by(|a, b| {
        a.updated_at_ms
            .cmp(&b.updated_at_ms)
            .then_with(|| a.key.cmp(&b.key))
    });
    items.truncate(limit);
    Ok(items)
}

/// Items [`EmbeddedStore::enqueue_unsent`] sends per write transaction.
const UNSENT_BATCH: usize = 512;
/// Transactions [`EmbeddedStore::enqueue_unsent`] runs at most (about 500,000 items);
/// the sweeper sends whatever is left after that.
const UNSENT_MAX_ROUNDS: usize = 1_000;

impl EmbeddedStore {
    /// Send the pointer of every `received` item, oldest first; returns how many.
    ///
    /// Here an item is `received` only between its put and its send (the send moves
    /// it to `queued` in the same transaction), so when `einmal serve` starts, before it
    /// accepts requests, these are the events a killed process stored but never
    /// enqueued. Sending them at once beats waiting for the sweeper's threshold; an
    /// item another process (a CLI) is about to send gets two pointers, and the
    /// second costs one refused claim, never a second effect.
    pub async fn enqueue_unsent(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        for _ in 0..UNSENT_MAX_ROUNDS {
            let sent = self
                .write(|conn| enqueue_unsent_batch(conn, UNSENT_BATCH))
                .await?;
            total += sent;
            if sent < UNSENT_BATCH {
                break;
            }
        }
        Ok(total)
    }
}

/// One transaction of [`EmbeddedStore::enqueue_unsent`]: up to `limit` items.
fn enqueue_unsent_batch(conn: &Connection, limit: usize) -> Result<usize, DbError> {
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let pks: Vec<String> = conn
        .prepare_cached(
            "SELECT pk FROM inbox INDEXED BY inbox_by_state_updated \
             WHERE state = 'received' ORDER BY updated_at_ms LIMIT ?1",
        )?
        .query_map([limit_sql], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for pk in &pks {
        let message = QueueMessage {
            pk: InboxKey::from_stored(pk.clone()),
        };
        let body =
            serde_json::to_string(&message).map_err(|e| DbError::Malformed(e.to_string()))?;
        send_message(conn, &message, &body)?;
    }
    Ok(pks.len())
}

#[async_trait]
impl InboxSweep for EmbeddedStore {
    async fn stuck(&self, older_than_ms: i64, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self
            .read(move |conn| stuck_items(conn, older_than_ms, limit))
            .await?)
    }

    async fn waiting(&self, due_before_ms: i64, limit: usize) -> Result<WaitingScan, StoreError> {
        Ok(self
            .read(move |conn| waiting::waiting_scan(conn, due_before_ms, limit))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub(super) static BATCHES: AtomicUsize = AtomicUsize::new(0);
    pub(super) static OPS: AtomicUsize = AtomicUsize::new(0);

    fn item(provider: &str, tenant: &str, event_id: &str, received_at_ms: i64) -> InboxItem {
        let envelope = Envelope {
            provider: provider.into(),
            tenant: tenant.into(),
            event_id: event_id.into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: Some("pi_1".into()),
            object_version: None,
            occurred_at: Some(1_700_000_000),
            delivery_id: Some(format!("dlv_{event_id}")),
        };
        InboxItem {
            key: envelope.key(),
            envelope,
            state: InboxState::Received,
            source: Source::Webhook,
            attempts: 0,
            received_at_ms,
            updated_at_ms: received_at_ms,
            expires_at: received_at_ms / 1000 + 86_400,
            enqueue_failed: false,
            last_error: None,
            last_error_class: None,
            lease_until_ms: None,
            lease_owner: None,
            result: None,
            body_encoding: "zstd".into(),
            body_len: 42,
            body: format!("body of {event_id}").into_bytes(),
            waiting: None,
        }
    }

    fn open(dir: &Path) -> EmbeddedStore {
        EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap()
    }

    fn msg(item: &InboxItem) -> QueueMessage {
        QueueMessage {
            pk: item.key.clone(),
        }
    }

    #[tokio::test]
    async fn insert_then_duplicate_returns_the_stored_item() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let first = item("stripe", "acme", "evt_1", 1_000);
        assert_eq!(store.put_new(&first).await.unwrap(), PutOutcome::Inserted);

        // A retry carries a different delivery id and time: the stored original comes back.
        let mut retry = first.clone();
        retry.envelope.delivery_id = Some("dlv_other".into());
        retry.received_at_ms = 2_000;
        retry.body = b"other".to_vec();
        match store.put_new(&retry).await.unwrap() {
            PutOutcome::Duplicate(existing) => assert_eq!(*existing, first),
            other => panic!("expected a duplicate, got {other:?}"),
        }
        assert_eq!(store.get(&first.key).await.unwrap(), Some(first.clone()));
        let missing = InboxKey::new("stripe", "acme", "evt_missing");
        assert_eq!(store.get(&missing).await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_puts_of_one_key_insert_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let base = item("stripe", "acme", "evt_race", 1_000);
        let mut tasks = Vec::new();
        for i in 0..50 {
            let store = store.clone();
            let mut candidate = base.clone();
            candidate.envelope.delivery_id = Some(format!("dlv_{i}"));
            tasks.push(tokio::spawn(async move {
                (candidate.clone(), store.put_new(&candidate).await.unwrap())
            }));
        }
        let mut winners = Vec::new();
        let mut duplicates = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (candidate, PutOutcome::Inserted) => winners.push(candidate),
                (_, PutOutcome::Duplicate(existing)) => duplicates.push(*existing),
            }
        }
        assert_eq!(winners.len(), 1);
        assert_eq!(duplicates.len(), 49);
        assert!(duplicates.iter().all(|d| *d == winners[0]));
        assert_eq!(
            store.get(&base.key).await.unwrap(),
            Some(winners[0].clone())
        );
    }

    #[tokio::test]
    async fn data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let a = item("shopify", "shop1", "evt_a", 1_000);
        {
            let store = open(dir.path());
            assert_eq!(store.put_new(&a).await.unwrap(), PutOutcome::Inserted);
            store.send(&msg(&a)).await.unwrap();
        }
        let store = open(dir.path());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Queued);
        assert_eq!(stored.body, a.body);
        let got = store.receive(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message, msg(&a));
        assert_eq!(got[0].receive_count, 1);
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.execute_batch("PRAGMA user_version = 99").unwrap();
        drop(raw);
        let err = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable(ref m) if m.contains("schema version 99")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_version_1_file_is_upgraded_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let v1_schema = SCHEMA.replace(
            ",\n    last_error_class TEXT,\n    lease_until_ms INTEGER,\n    lease_owner    TEXT,\n    result         TEXT",
            "",
        );
        assert_ne!(v1_schema, SCHEMA);
        let a = item("p", "t", "old", 1);
        {
            let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
            raw.execute_batch(&format!("{v1_schema} PRAGMA user_version = 1;"))
                .unwrap();
            raw.execute(
                "INSERT INTO inbox (pk, provider, tenant, event_id, event_type, state, source, \
                 attempts, received_at_ms, updated_at_ms, expires_at, enqueue_failed, \
                 body_encoding, body_len, body) \
                 VALUES (?1, 'p', 't', 'old', ?2, 'queued', 'webhook', 0, 1, 1, 86400, 0, 'zstd', 42, ?3)",
                params![a.key.as_str(), a.envelope.event_type, a.body],
            )
            .unwrap();
        }
        let store = open(dir.path());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Queued);
        assert_eq!((stored.lease_owner, stored.result), (None, None));
        assert!(matches!(
            store.claim(&a.key, "w1", 10, 1_000).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let raw = Connection::open(store.path()).unwrap();
        let version: i64 = raw
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    fn finish(state: InboxState, now_ms: i64) -> Finish {
        Finish {
            state,
            error_class: None,
            error: None,
            result: None,
            now_ms,
            wait: Default::default(),
        }
    }

    #[tokio::test]
    async fn claim_leases_and_finish_releases() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_claim", 1_000);
        store.put_new(&a).await.unwrap();
        store.send(&msg(&a)).await.unwrap();

        // Fresh: claimed with the body, attempts 1, leased to w1.
        let claimed = match store.claim(&a.key, "w1", 10_000, 30_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(claimed.body, a.body);
        assert_eq!(claimed.state, InboxState::Processing);
        assert_eq!(claimed.attempts, 1);
        assert_eq!(claimed.lease_owner.as_deref(), Some("w1"));
        assert_eq!(claimed.lease_until_ms, Some(40_000));
        assert_eq!(claimed.updated_at_ms, 10_000);

        // Leased: another worker (or the same one again) is refused until it runs out.
        for (owner, now) in [("w2", 10_001), ("w1", 39_999)] {
            assert_eq!(
                store.claim(&a.key, owner, now, 30_000).await.unwrap(),
                ClaimOutcome::Leased { until_ms: 40_000 }
            );
        }
        // Expired (w1 crashed): w2 claims, attempts 2.
        let again = match store.claim(&a.key, "w2", 40_000, 30_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(again.attempts, 2);
        assert_eq!(again.lease_owner.as_deref(), Some("w2"));

        // The old owner can no longer finish.
        assert!(!store
            .finish(&a.key, "w1", &finish(InboxState::Completed, 41_000))
            .await
            .unwrap());
        let mut done = finish(InboxState::Completed, 41_000);
        done.result = Some("counter +1".into());
        assert!(store.finish(&a.key, "w2", &done).await.unwrap());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Completed);
        assert_eq!(stored.result.as_deref(), Some("counter +1"));
        assert_eq!((stored.lease_owner, stored.lease_until_ms), (None, None));
        assert_eq!(stored.updated_at_ms, 41_000);
        // Finished twice: the lease is gone.
        assert!(!store.finish(&a.key, "w2", &done).await.unwrap());

        assert_eq!(
            store.claim(&a.key, "w3", 99_000, 30_000).await.unwrap(),
            ClaimOutcome::Finished(InboxState::Completed)
        );
        let missing = InboxKey::new("stripe", "acme", "nope");
        assert_eq!(
            store.claim(&missing, "w3", 99_000, 30_000).await.unwrap(),
            ClaimOutcome::Missing
        );
    }

    #[tokio::test]
    async fn retryable_keeps_errors_and_is_claimable_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("p", "t", "evt_retry", 1);
        store.put_new(&a).await.unwrap();
        assert!(matches!(
            store.claim(&a.key, "w1", 100, 1_000).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let retry = Finish {
            state: InboxState::Retryable,
            error_class: Some("transient".into()),
            error: Some("waiting: payment first".into()),
            result: None,
            now_ms: 200,
            wait: Default::default(),
        };
        assert!(store.finish(&a.key, "w1", &retry).await.unwrap());
        let claimed = match store.claim(&a.key, "w2", 300, 1_000).await.unwrap() {
            ClaimOutcome::Claimed(item) => item,
            other => panic!("expected a claim, got {other:?}"),
        };
        assert_eq!(claimed.attempts, 2);
        assert_eq!(claimed.last_error_class.as_deref(), Some("transient"));
        // Completing without an error keeps the last one for support.
        assert!(store
            .finish(&a.key, "w2", &finish(InboxState::Completed, 400))
            .await
            .unwrap());
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Completed);
        assert_eq!(stored.last_error.as_deref(), Some("waiting: payment first"));
    }

    #[tokio::test]
    async fn mark_dead_letter_spares_terminal_and_live_items() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let waiting = item("p", "t", "waiting", 1);
        let live = item("p", "t", "live", 2);
        let done = item("p", "t", "done", 3);
        for it in [&waiting, &live, &done] {
            store.put_new(it).await.unwrap();
        }
        store.claim(&live.key, "w1", 100, 10_000).await.unwrap();
        store.claim(&done.key, "w1", 100, 10_000).await.unwrap();
        assert!(store
            .finish(&done.key, "w1", &finish(InboxState::Completed, 150))
            .await
            .unwrap());
        for it in [&waiting, &live, &done] {
            store
                .mark_dead_letter(&it.key, "redriven after 5 receives", 200)
                .await
                .unwrap();
        }
        store
            .mark_dead_letter(&InboxKey::new("p", "t", "missing"), "x", 200)
            .await
            .unwrap();
        let state = |it: &InboxItem| {
            let key = it.key.clone();
            let store = &store;
            async move { store.get(&key).await.unwrap().unwrap() }
        };
        let w = state(&waiting).await;
        assert_eq!(w.state, InboxState::DeadLetter);
        assert_eq!(w.last_error.as_deref(), Some("redriven after 5 receives"));
        assert_eq!(state(&live).await.state, InboxState::Processing);
        assert_eq!(state(&done).await.state, InboxState::Completed);
        // Once the lease ran out, the stuck item is marked too.
        store
            .mark_dead_letter(&live.key, "redriven", 20_000)
            .await
            .unwrap();
        let l = state(&live).await;
        assert_eq!(l.state, InboxState::DeadLetter);
        assert_eq!(l.lease_owner, None);
    }

    #[tokio::test]
    async fn send_dead_letter_goes_straight_to_the_dlq() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("p", "t", "dead", 1);
        store.send_dead_letter(&msg(&a)).await.unwrap();
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
        let dead = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message, msg(&a));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_claims_hand_out_one_lease() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let a = item("p", "t", "race", 1);
        store.put_new(&a).await.unwrap();
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = store.clone();
                let key = a.key.clone();
                tokio::spawn(async move {
                    store
                        .claim(&key, &format!("w{i}"), 1_000, 30_000)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut claimed = 0;
        for t in tasks {
            match t.await.unwrap() {
                ClaimOutcome::Claimed(_) => claimed += 1,
                ClaimOutcome::Leased { until_ms } => assert_eq!(until_ms, 31_000),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(claimed, 1);
    }

    #[tokio::test]
    async fn open_creates_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let store = open(&nested);
        assert_eq!(store.path(), nested.join(DB_FILE));
        assert!(nested.join(DB_FILE).exists());
    }

    #[tokio::test]
    async fn send_marks_received_items_queued() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_1", 1_000);
        store.put_new(&a).await.unwrap();
        store.send(&msg(&a)).await.unwrap();
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Queued);
        assert!(stored.updated_at_ms > a.updated_at_ms);

        // A message whose item does not exist is still enqueued.
        let ghost = QueueMessage {
            pk: InboxKey::new("stripe", "acme", "evt_ghost"),
        };
        store.send(&ghost).await.unwrap();
        let got = store.receive(10, Duration::from_secs(30)).await.unwrap();
        let keys: Vec<_> = got.iter().map(|d| d.message.clone()).collect();
        assert_eq!(keys, vec![msg(&a), ghost]);
        assert_eq!(
            store
                .get(&InboxKey::new("stripe", "acme", "evt_ghost"))
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn mark_enqueue_failed_applies_only_while_received() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_a", 1_000);
        let b = item("stripe", "acme", "evt_b", 1_001);
        store.put_new(&a).await.unwrap();
        store.put_new(&b).await.unwrap();
        store.send(&msg(&b)).await.unwrap();

        store.mark_enqueue_failed(&a.key).await.unwrap();
        store.mark_enqueue_failed(&b.key).await.unwrap();
        store
            .mark_enqueue_failed(&InboxKey::new("x", "y", "z"))
            .await
            .unwrap();

        let a_now = store.get(&a.key).await.unwrap().unwrap();
        assert!(a_now.enqueue_failed);
        assert_eq!(a_now.state, InboxState::Received);
        assert_eq!(a_now.updated_at_ms, a.updated_at_ms);
        let b_now = store.get(&b.key).await.unwrap().unwrap();
        assert!(!b_now.enqueue_failed);
        assert_eq!(b_now.state, InboxState::Queued);
        // The flag comes back with a duplicate.
        match store.put_new(&a).await.unwrap() {
            PutOutcome::Duplicate(existing) => assert!(existing.enqueue_failed),
            other => panic!("expected a duplicate, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn receive_hides_messages_and_ack_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for i in 0..3 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("e{i}")),
                })
                .await
                .unwrap();
        }
        assert!(store
            .receive(0, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty());
        let first = store.receive(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].message.pk, InboxKey::new("p", "t", "e0"));
        assert_eq!(first[1].message.pk, InboxKey::new("p", "t", "e1"));
        assert!(first.iter().all(|d| d.receive_count == 1));
        assert_ne!(first[0].receipt, first[1].receipt);

        let second = store.receive(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].message.pk, InboxKey::new("p", "t", "e2"));
        assert!(store
            .receive(10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty());

        for d in first.iter().chain(second.iter()) {
            store.ack(&d.receipt).await.unwrap();
        }
        // Acking twice is harmless.
        store.ack(&first[0].receipt).await.unwrap();
        for d in first.iter().chain(second.iter()) {
            store
                .change_visibility(&d.receipt, Duration::ZERO)
                .await
                .unwrap();
        }
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn change_visibility_zero_makes_a_message_visible_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let m = QueueMessage {
            pk: InboxKey::new("p", "t", "e"),
        };
        store.send(&m).await.unwrap();
        let got = store.receive(1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());

        store
            .change_visibility(&got[0].receipt, Duration::ZERO)
            .await
            .unwrap();
        let again = store.receive(1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message, m);
        assert_eq!(again[0].receive_count, 2);
        assert_ne!(again[0].receipt, got[0].receipt);

        // Extending visibility keeps it hidden.
        store
            .change_visibility(&again[0].receipt, Duration::from_secs(600))
            .await
            .unwrap();
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn stale_receipts_do_not_touch_a_re_received_message() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let m = QueueMessage {
            pk: InboxKey::new("p", "t", "e"),
        };
        store.send(&m).await.unwrap();
        let r1 = store.receive(1, Duration::ZERO).await.unwrap().remove(0);
        let r2 = store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(r2.receive_count, 2);

        store.ack(&r1.receipt).await.unwrap();
        store
            .change_visibility(&r1.receipt, Duration::ZERO)
            .await
            .unwrap();
        // Still there and still hidden under r2.
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        store
            .change_visibility(&r2.receipt, Duration::ZERO)
            .await
            .unwrap();
        let r3 = store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(r3.message, m);
        assert_eq!(r3.receive_count, 3);

        store.ack(&r3.receipt).await.unwrap();
        store
            .change_visibility(&r3.receipt, Duration::ZERO)
            .await
            .unwrap();
        assert!(store.receive(1, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn malformed_receipts_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for bad in ["", "x.1.abc", "q.notanumber.abc", "q.1", "q.1."] {
            assert!(
                matches!(store.ack(bad).await, Err(QueueError::Malformed(_))),
                "{bad:?}"
            );
            assert!(
                matches!(
                    store.change_visibility(bad, Duration::ZERO).await,
                    Err(QueueError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn redrive_to_dead_letters_after_max_receive_count() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(
            dir.path(),
            EmbeddedOptions {
                max_receive_count: 2,
            },
        )
        .unwrap();
        let poison = QueueMessage {
            pk: InboxKey::new("p", "t", "poison"),
        };
        let healthy = QueueMessage {
            pk: InboxKey::new("p", "t", "healthy"),
        };
        store.send(&poison).await.unwrap();

        let d1 = store.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(d1.len(), 1);
        assert_eq!(d1[0].receive_count, 1);
        let d2 = store.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(d2.len(), 1);
        assert_eq!(d2[0].receive_count, 2);
        assert!(store
            .receive_dead_letters(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());

        // The third attempt moves it instead of delivering it; other messages still come.
        store.send(&healthy).await.unwrap();
        let d3 = store.receive(10, Duration::from_secs(60)).await.unwrap();
        assert_eq!(d3.len(), 1);
        assert_eq!(d3[0].message, healthy);
        assert_eq!(d3[0].receive_count, 1);
        // The old receipt no longer reaches it.
        store.ack(&d2[0].receipt).await.unwrap();

        let dead = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message, poison);
        assert_eq!(
            dead[0].receive_count, 3,
            "the receive count carries over, as in SQS"
        );
        assert!(store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());

        // Dead letters are never redriven further, and ack deletes them.
        store
            .change_visibility(&dead[0].receipt, Duration::ZERO)
            .await
            .unwrap();
        for expected in 4..8 {
            let again = store
                .receive_dead_letters(10, Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].receive_count, expected);
        }
        let last = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        store.ack(&last.receipt).await.unwrap();
        store.ack(&d3[0].receipt).await.unwrap();
        assert!(store
            .receive_dead_letters(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_receive_skips_past_redriven_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(
            dir.path(),
            EmbeddedOptions {
                max_receive_count: 1,
            },
        )
        .unwrap();
        for i in 0..3 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("old{i}")),
                })
                .await
                .unwrap();
        }
        assert_eq!(store.receive(10, Duration::ZERO).await.unwrap().len(), 3);
        for i in 0..2 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("new{i}")),
                })
                .await
                .unwrap();
        }
        // The three old ones fill the first select; they go to the DLQ and the receive
        // goes on to deliver the new ones.
        let got = store.receive(2, Duration::ZERO).await.unwrap();
        let keys: Vec<_> = got.iter().map(|d| d.message.pk.clone()).collect();
        assert_eq!(
            keys,
            vec![
                InboxKey::new("p", "t", "new0"),
                InboxKey::new("p", "t", "new1")
            ]
        );
        assert_eq!(
            store
                .receive_dead_letters(10, Duration::from_secs(60))
                .await
                .unwrap()
                .len(),
            3
        );
    }

    #[tokio::test]
    async fn list_filters_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let items = [
            item("stripe", "acme", "e1", 1_000),
            item("stripe", "beta", "e2", 2_000),
            item("shopify", "acme", "e3", 3_000),
            item("stripe", "acme", "e4", 4_000),
        ];
        for it in &items {
            assert_eq!(store.put_new(it).await.unwrap(), PutOutcome::Inserted);
        }
        store.send(&msg(&items[1])).await.unwrap();
        let ids = |v: Vec<InboxItem>| {
            v.into_iter()
                .map(|i| i.envelope.event_id)
                .collect::<Vec<_>>()
        };

        let all = store.list(&InboxFilter::default()).await.unwrap();
        assert_eq!(all[0].body, items[3].body);
        assert_eq!(ids(all), ["e4", "e3", "e2", "e1"]);
        let f = |state: Option<InboxState>,
                 provider: Option<&str>,
                 tenant: Option<&str>,
                 limit: usize| InboxFilter {
            state,
            provider: provider.map(String::from),
            tenant: tenant.map(String::from),
            limit,
        };
        assert_eq!(
            ids(store
                .list(&f(Some(InboxState::Queued), None, None, 0))
                .await
                .unwrap()),
            ["e2"]
        );
        assert_eq!(
            ids(store
                .list(&f(Some(InboxState::Received), None, None, 0))
                .await
                .unwrap()),
            ["e4", "e3", "e1"]
        );
        assert_eq!(
            ids(store.list(&f(None, Some("stripe"), None, 0)).await.unwrap()),
            ["e4", "e2", "e1"]
        );
        assert_eq!(
            ids(store.list(&f(None, None, Some("acme"), 0)).await.unwrap()),
            ["e4", "e3", "e1"]
        );
        assert_eq!(
            ids(store
                .list(&f(None, Some("stripe"), Some("acme"), 1))
                .await
                .unwrap()),
            ["e4"]
        );
        assert_eq!(
            ids(store
                .list(&f(
                    Some(InboxState::Received),
                    Some("stripe"),
                    Some("acme"),
                    0
                ))
                .await
                .unwrap()),
            ["e4", "e1"]
        );
        assert!(store
            .list(&f(Some(InboxState::Completed), None, None, 0))
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .list(&f(None, Some("github"), None, 0))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn list_limit_zero_means_one_hundred() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let puts = (0..105).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put_new(&item("p", "t", &format!("e{i}"), i))
                    .await
                    .unwrap()
            })
        });
        for p in puts.collect::<Vec<_>>() {
            assert_eq!(p.await.unwrap(), PutOutcome::Inserted);
        }
        let listed = store.list(&InboxFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 100);
        assert_eq!(listed[0].envelope.event_id, "e104");
        assert_eq!(listed[99].envelope.event_id, "e5");
    }

    #[tokio::test]
    async fn undecodable_rows_are_corrupt_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("p", "t", "bad_state", 1);
        let b = item("p", "t", "bad_attempts", 2);
        store.put_new(&a).await.unwrap();
        store.put_new(&b).await.unwrap();
        let raw = Connection::open(store.path()).unwrap();
        raw.execute(
            "UPDATE inbox SET state = 'bogus' WHERE pk = ?1",
            [a.key.as_str()],
        )
        .unwrap();
        raw.execute(
            "UPDATE inbox SET attempts = 'many' WHERE pk = ?1",
            [b.key.as_str()],
        )
        .unwrap();
        assert!(matches!(
            store.get(&a.key).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            store.get(&b.key).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            store.put_new(&a).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            store.list(&InboxFilter::default()).await,
            Err(StoreError::Corrupt(_))
        ));

        // An undecodable queue message goes to the dead letters instead of blocking the queue.
        raw.execute("INSERT INTO queue (body, visible_at_ms, receive_count, sent_at_ms) VALUES ('{', 0, 0, 0)", [])
            .unwrap();
        let good = QueueMessage { pk: a.key.clone() };
        store.send(&good).await.unwrap();
        let got = store.receive(10, Duration::from_secs(60)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message, good);
        let dead_rows: i64 = raw
            .query_row("SELECT count(*) FROM dead_letter", [], |r| r.get(0))
            .unwrap();
        assert_eq!(dead_rows, 1);
        assert!(store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
    }

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
            }),
            Box::new(Op {
                work: Some(failing),
                result: None,
                reply: tf,
            }),
            Box::new(Op {
                work: Some(move |c: &Connection| put_item(c, &b2)),
                result: None,
                reply: tb,
            }),
        ];
        run_batch(&conn, &mut batch);
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
            }),
            Box::new(Op {
                work: Some(|c: &Connection| -> Result<(), DbError> {
                    c.execute("INSERT INTO child (pid) VALUES (7)", [])?;
                    Ok(())
                }),
                result: None,
                reply: tf,
            }),
        ];
        run_batch(&conn, &mut batch);
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

    #[tokio::test]
    async fn a_closed_store_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        drop(store.writer.take());
        let a = item("p", "t", "a", 1);
        assert!(matches!(
            store.put_new(&a).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            store.send(&msg(&a)).await,
            Err(QueueError::Unavailable(_))
        ));
    }

    /// Throughput sanity check: `cargo test --release -p einmal-shared --lib
    /// adapters::embedded::tests::throughput -- --ignored --nocapture`
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
            let (batches, ops) = (BATCHES.load(Ordering::Relaxed), OPS.load(Ordering::Relaxed));
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
