//! Embedded adapter: every storage port on SQLite. The inbox, the work queue and
//! the business records share one file (`einmal.sqlite`) and one writer, so the
//! receiver's inserts and the processor's claims, business commits, finishes and
//! acks share group commits; the audit log (`audit.sqlite`) has its own file.
//!
//! One file per port (`inbox`, `queue`, `sweep`, `hints`, `replay`, `state`,
//! `audit`, `certs`, `purge`); `writer` is the group-commit writer thread every write of
//! `einmal.sqlite` goes through, `schema` the tables and migrations, `waiting` the
//! parked items.
//!
//! Reads (`get`, `list`) use a small pool of separate connections; WAL lets them
//! run while the writer commits. A read that starts after a write returned sees it.

mod audit;
mod backup;
mod certs;
mod hints;
mod inbox;
mod item_row;
mod purge;
mod queue;
mod relay;
mod replay;
mod schema;
mod search;
mod state;
mod stats;
mod sweep;
mod waiting;
mod writer;

pub use audit::EmbeddedAuditLog;
pub use backup::{backup_file, check_copy, restore_file, CheckedCopy, CopyProgress, Restored};
pub use purge::defaults as purge_defaults;
pub use purge::{
    purge_clock_ms, run_purge_loop, PurgeReport, PurgeSettings, CLOCK_OFFSET_ENV,
    DEAD_LETTER_RETENTION_MS,
};
pub use state::{EmbeddedStateStore, LEGACY_STATE_DB_FILE};
pub use stats::{wal_path, StoreStats, TableRows, TABLES};
pub use writer::CommitStats;

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::ports::{QueueError, StoreError};
use writer::Job;

/// File name of the database inside the store directory.
pub const DB_FILE: &str = "einmal.sqlite";

/// Read connections: at most this many reads run at once (the others wait for a
/// connection), and all of them stay open. Without the bound a burst opened a new
/// connection per read beyond the idle ones (parsing the schema each time) on a
/// blocking thread of its own, and closed it after: under load the receiver's and the
/// processor's reads spent more CPU on opening connections and switching threads than
/// on reading.
const MAX_READERS: usize = 4;
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
    /// One permit per read connection ([`MAX_READERS`]).
    read_permits: Arc<tokio::sync::Semaphore>,
    max_receive_count: u32,
    counters: Arc<writer::Counters>,
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
        let conn = writer::open_writer(&path).map_err(StoreError::from)?;
        // Business records of a version that kept them in their own file move in
        // before anything else runs.
        state::import_legacy(&conn, dir)?;
        let checkpoint_conn = writer::open_checkpointer(&path).map_err(StoreError::from)?;
        // The writer nudges the checkpointer after commits; when the writer stops, the
        // nudge channel closes and the checkpointer stops too.
        let (nudge, nudged) = mpsc::sync_channel::<()>(1);
        let checkpointer_thread = std::thread::Builder::new()
            .name("einmal-sqlite-checkpoint".into())
            .spawn(move || writer::checkpoint_loop(checkpoint_conn, nudged))
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}"))
            })?;
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let counters = Arc::new(writer::Counters::default());
        let writer_counters = counters.clone();
        let writer_thread = std::thread::Builder::new()
            .name("einmal-sqlite-writer".into())
            .spawn(move || writer::writer_loop(conn, rx, nudge, writer_counters))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the writer thread: {e}")))?;
        Ok(EmbeddedStore {
            readers: Arc::new(Readers {
                path: path.clone(),
                idle: Mutex::new(Vec::with_capacity(MAX_READERS)),
            }),
            read_permits: Arc::new(tokio::sync::Semaphore::new(MAX_READERS)),
            path,
            writer: Some(tx),
            writer_thread: Some(writer_thread),
            checkpointer_thread: Some(checkpointer_thread),
            max_receive_count: options.max_receive_count.max(1),
            counters,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
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
            Ok(handle) => {
                let permit = self
                    .read_permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| DbError::Unavailable("the read pool is closed".into()))?;
                handle
                    .spawn_blocking(move || {
                        let _permit = permit;
                        readers.with(work)
                    })
                    .await
                    .map_err(|e| DbError::Unavailable(format!("read task failed: {e}")))?
            }
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
    /// A write the store refuses for good (a business record SQLite finds too big,
    /// a constraint): `StoreError::Rejected`.
    Rejected(String),
}

/// How an error of a write the disk refused starts (SQLite's `SQLITE_FULL`, an I/O
/// error): the writer watches for it to say when the store cannot write
/// ([`EmbeddedStore::writes_failing`]).
pub(super) const DISK_REFUSED: &str = "the disk refused a write";

impl DbError {
    /// A write the disk refused (full, I/O error): heals when space returns.
    pub(super) fn is_disk_refusal(&self) -> bool {
        matches!(self, DbError::Unavailable(m) if m.starts_with(DISK_REFUSED))
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        if let E::SqliteFailure(f, _) = &e {
            if matches!(
                f.code,
                rusqlite::ErrorCode::DiskFull | rusqlite::ErrorCode::SystemIoFailure
            ) {
                return DbError::Unavailable(format!("{DISK_REFUSED} (full or I/O error): {e}"));
            }
        }
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
            DbError::Rejected(m) => StoreError::Rejected(m),
        }
    }
}

impl From<DbError> for QueueError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(m) => QueueError::Unavailable(m),
            DbError::Corrupt(m) | DbError::Malformed(m) | DbError::Rejected(m) => {
                QueueError::Malformed(m)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Read connections

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

/// The read connections: opened on first need and kept, at most [`MAX_READERS`] in
/// use through [`EmbeddedStore::read`].
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
                if idle.len() < MAX_READERS {
                    idle.push(conn);
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use rusqlite::Connection;

    use super::{EmbeddedOptions, EmbeddedStore, DB_FILE};
    use crate::envelope::Envelope;
    use crate::ports::{
        Inbox, InboxFilter, InboxItem, InboxState, PutOutcome, Queue, QueueError, QueueMessage,
        Source, StoreError,
    };

    pub(super) fn item(
        provider: &str,
        tenant: &str,
        event_id: &str,
        received_at_ms: i64,
    ) -> InboxItem {
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
            deliveries: Vec::new(),
            relay_due_ms: None,
        }
    }

    pub(super) fn open(dir: &Path) -> EmbeddedStore {
        EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap()
    }

    pub(super) fn msg(item: &InboxItem) -> QueueMessage {
        QueueMessage {
            pk: item.key.clone(),
        }
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
    async fn open_creates_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let store = open(&nested);
        assert_eq!(store.path(), nested.join(DB_FILE));
        assert!(nested.join(DB_FILE).exists());
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
}
