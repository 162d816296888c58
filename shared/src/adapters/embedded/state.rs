//! Embedded [`StateStore`]: versioned business records in their own SQLite file
//! (`dir/state.sqlite`), next to the inbox's `einmal.sqlite`.
//!
//! # Durability and atomicity
//!
//! WAL mode with `synchronous=FULL`: a commit is fsynced before [`StateStore::commit`]
//! returns `Committed`. A commit is one `BEGIN IMMEDIATE … COMMIT` transaction: it
//! takes the write lock first, then checks every write's expected version (a missing
//! row is version 0), and the version of every record the decision only read
//! ([`ReadCheck`]), and only if all of them still hold upserts every record. Any
//! mismatch rolls the whole transaction back and answers `Conflict`, so a multi-record
//! commit changes all of its records or none.
//!
//! # Concurrency
//!
//! Writes go through one connection behind a mutex (SQLite allows one writer at a
//! time anyway); reads use a small pool of other connections, which WAL lets run
//! while a write commits. Both run on tokio's blocking pool, never on the async
//! worker threads. A multi-key `load` reads one snapshot (one read transaction).
//! Another process opening the same file (e.g. the CLI) waits up to [`BUSY_TIMEOUT`]
//! for the lock, then the call fails as `Unavailable`.
//!
//! # Errors
//!
//! I/O and lock failures are `StoreError::Unavailable`; a row whose JSON or numbers
//! cannot be decoded is `StoreError::Corrupt`. A write that can never succeed is
//! `StoreError::Rejected`: a malformed commit, a record over [`MAX_RECORD_BYTES`]
//! (DynamoDB's item limit, refused here too so that local and AWS behave alike), and
//! SQLite's own "too big", constraint and type-mismatch errors. Nothing here panics
//! on bad data.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{
    params, Connection, ErrorCode, OpenFlags, OptionalExtension, Row, TransactionBehavior,
};

use crate::domain::state::check_writes;
use crate::domain::state::{
    CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite, MAX_RECORD_BYTES,
};
use crate::ports::StoreError;
use crate::time::now_millis;

/// File name of the state database inside the store directory.
pub const STATE_DB_FILE: &str = "state.sqlite";
/// `list` with `limit == 0` returns this many records (as the inbox listing does).
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// How long a connection waits for a lock held by another connection or process.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle read connections kept open.
const MAX_IDLE_READERS: usize = 4;
/// Stored in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

/// `WITHOUT ROWID`: the table is clustered on `pk`, and the `(tenant, kind)` index
/// carries `pk`, so `list` reads the index in key order.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS state (
    pk            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    id            TEXT NOT NULL,
    version       INTEGER NOT NULL,
    data          TEXT NOT NULL,
    applied       TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS state_by_tenant_kind ON state(tenant, kind);
";

/// Business records in `dir/state.sqlite`. Share it as `Arc<EmbeddedStateStore>`.
pub struct EmbeddedStateStore {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Readers>,
}

impl std::fmt::Debug for EmbeddedStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStateStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStateStore {
    /// Open (or create) `dir/state.sqlite`, creating `dir` if needed.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
        })?;
        let path = dir.join(STATE_DB_FILE);
        let writer = open_writer(&path)?;
        Ok(EmbeddedStateStore {
            readers: Arc::new(Readers {
                path: path.clone(),
                idle: Mutex::new(Vec::new()),
            }),
            path,
            writer: Arc::new(Mutex::new(writer)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let readers = self.readers.clone();
        blocking(move || readers.with(work)).await
    }

    async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let writer = self.writer.clone();
        blocking(move || work(&mut lock(&writer))).await
    }
}

/// Off the async worker threads when a tokio runtime is present.
async fn blocking<T, F>(work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(work)
            .await
            .map_err(|e| StoreError::Unavailable(format!("state store task failed: {e}")))?,
        Err(_) => work(),
    }
}

/// A poisoned lock only means another caller panicked while holding it; rusqlite
/// rolled its transaction back while unwinding, so the connection is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn unavailable(e: rusqlite::Error) -> StoreError {
    use rusqlite::Error as E;
    match e {
        E::FromSqlConversionFailure(..)
        | E::InvalidColumnType(..)
        | E::IntegralValueOutOfRange(..)
        | E::Utf8Error(..) => StoreError::Corrupt(format!("state row: {e}")),
        E::SqliteFailure(ref f, _)
            if matches!(
                f.code,
                ErrorCode::TooBig | ErrorCode::ConstraintViolation | ErrorCode::TypeMismatch
            ) =>
        {
            StoreError::Rejected(format!("state store: {e}"))
        }
        other => StoreError::Unavailable(format!("state store: {other}")),
    }
}

fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(unavailable)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(format!(
            "cannot switch {} to WAL (mode {mode})",
            path.display()
        )));
    }
    // FULL: the WAL is fsynced at every commit, so a committed write survives power loss.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;")
        .map_err(unavailable)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(unavailable)?;
    match version {
        SCHEMA_VERSION => {}
        0 => conn
            .execute_batch(&format!(
                "BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))
            .map_err(unavailable)?,
        other => {
            return Err(StoreError::Unavailable(format!(
                "{} has schema version {other}, this build knows {SCHEMA_VERSION}",
                path.display()
            )))
        }
    }
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
    conn.execute_batch("PRAGMA query_only = ON;")
        .map_err(unavailable)?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// A few idle read connections; more are opened on demand.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn with<T>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = lock(&self.idle).pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&self.path)?,
        };
        let result = work(&conn);
        // A connection left inside a transaction (an error mid-read) is not reused.
        if conn.is_autocommit() {
            let mut idle = lock(&self.idle);
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
        }
        result
    }
}

fn to_i64(v: u64, what: &str, pk: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Rejected(format!("{pk}: {what} {v} is out of range")))
}

/// The limit DynamoDB applies to an item, applied here to the same measure.
fn check_sizes(writes: &[StateWrite]) -> Result<(), StoreError> {
    for w in writes {
        let size = w.record.stored_size();
        if size > MAX_RECORD_BYTES {
            return Err(StoreError::Rejected(format!(
                "state {}: record of {size} bytes exceeds the {MAX_RECORD_BYTES}-byte limit",
                w.record.key.pk()
            )));
        }
    }
    Ok(())
}

/// The columns every read selects, in this order.
const COLUMNS: &str = "pk, tenant, kind, id, version, data, applied";

/// Decode one row. Errors name the key and the column, never the data.
fn decode(row: &Row<'_>) -> Result<StateRecord, StoreError> {
    let pk: String = row.get(0).map_err(unavailable)?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("state {pk}: {what}"));
    let key = StateKey {
        tenant: row.get(1).map_err(unavailable)?,
        kind: row.get(2).map_err(unavailable)?,
        id: row.get(3).map_err(unavailable)?,
    };
    if key.pk() != pk {
        return Err(corrupt("tenant, kind and id do not match the key"));
    }
    let version: i64 = row.get(4).map_err(unavailable)?;
    let version = u64::try_from(version).map_err(|_| corrupt("negative version"))?;
    let data: String = row.get(5).map_err(unavailable)?;
    let data = serde_json::from_str(&data).map_err(|_| corrupt("data is not JSON"))?;
    let applied: String = row.get(6).map_err(unavailable)?;
    let applied: BTreeSet<String> = serde_json::from_str(&applied)
        .map_err(|_| corrupt("applied is not a JSON array of strings"))?;
    Ok(StateRecord {
        key,
        version,
        data,
        applied,
    })
}

fn load_in(conn: &Connection, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM state WHERE pk = ?1"))
        .map_err(unavailable)?;
    let mut found: HashMap<String, StateRecord> = HashMap::with_capacity(keys.len());
    for key in keys {
        let pk = key.pk();
        if found.contains_key(&pk) {
            continue;
        }
        let mut rows = stmt.query(params![pk]).map_err(unavailable)?;
        if let Some(row) = rows.next().map_err(unavailable)? {
            found.insert(pk, decode(row)?);
        }
    }
    Ok(keys
        .iter()
        .map(|key| match found.get(&key.pk()) {
            Some(record) => record.clone(),
            None => StateRecord::missing(key.clone()),
        })
        .collect())
}

fn commit_in(
    conn: &mut Connection,
    writes: &[StateWrite],
    reads: &[ReadCheck],
) -> Result<CommitOutcome, StoreError> {
    // IMMEDIATE: take the write lock before reading the versions, so nobody can
    // change them between the check and the upsert.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    {
        let mut current = tx
            .prepare_cached("SELECT version FROM state WHERE pk = ?1")
            .map_err(unavailable)?;
        let expected = writes
            .iter()
            .map(|w| (&w.record.key, w.expected_version))
            .chain(reads.iter().map(|r| (&r.key, r.version)));
        for (key, version) in expected {
            let stored: Option<i64> = current
                .query_row(params![key.pk()], |r| r.get(0))
                .optional()
                .map_err(unavailable)?;
            let stored = stored.unwrap_or(0);
            if u64::try_from(stored).ok() != Some(version) {
                // Dropping `tx` rolls back; nothing was written yet anyway.
                return Ok(CommitOutcome::Conflict);
            }
        }
        let mut upsert = tx
            .prepare_cached(
                "INSERT INTO state (pk, tenant, kind, id, version, data, applied, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(pk) DO UPDATE SET
                    version = excluded.version,
                    data = excluded.data,
                    applied = excluded.applied,
                    updated_at_ms = excluded.updated_at_ms",
            )
            .map_err(unavailable)?;
        let now = now_millis();
        for w in writes {
            let r = &w.record;
            let pk = r.key.pk();
            let version = to_i64(r.version, "version", &pk)?;
            let data = serde_json::to_string(&r.data).map_err(|e| {
                StoreError::Unavailable(format!("{pk}: data cannot be serialized: {e}"))
            })?;
            let applied = serde_json::to_string(&r.applied).map_err(|e| {
                StoreError::Unavailable(format!("{pk}: applied cannot be serialized: {e}"))
            })?;
            upsert
                .execute(params![
                    pk,
                    r.key.tenant,
                    r.key.kind,
                    r.key.id,
                    version,
                    data,
                    applied,
                    now
                ])
                .map_err(unavailable)?;
        }
    }
    tx.commit().map_err(unavailable)?;
    Ok(CommitOutcome::Committed)
}

fn list_in(
    conn: &Connection,
    tenant: &str,
    kind: &str,
    limit: usize,
) -> Result<Vec<StateRecord>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM state WHERE tenant = ?1 AND kind = ?2 ORDER BY pk LIMIT ?3"
        ))
        .map_err(unavailable)?;
    let mut rows = stmt
        .query(params![tenant, kind, limit])
        .map_err(unavailable)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(unavailable)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

#[async_trait]
impl StateStore for EmbeddedStateStore {
    /// One snapshot for all keys; duplicates are read once and returned at every
    /// position they were asked for.
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = keys.to_vec();
        self.read(move |conn| {
            // One read transaction = one consistent snapshot across the keys.
            conn.execute_batch("BEGIN DEFERRED").map_err(unavailable)?;
            let result = load_in(conn, &keys);
            let end = conn.execute_batch("COMMIT").map_err(unavailable);
            let records = result?;
            end?;
            Ok(records)
        })
        .await
    }

    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError> {
        self.commit_checked(writes, &[]).await
    }

    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        // Checks without writes change nothing, so there is nothing to make atomic.
        if writes.is_empty() {
            return Ok(CommitOutcome::Committed);
        }
        check_writes(writes, reads)?;
        check_sizes(writes)?;
        let (writes, reads) = (writes.to_vec(), reads.to_vec());
        self.write(move |conn| commit_in(conn, &writes, &reads))
            .await
    }

    /// In key (`pk`) order; `limit == 0` means [`DEFAULT_LIST_LIMIT`].
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        let limit = crate::ports::limit_or(limit, DEFAULT_LIST_LIMIT);
        let (tenant, kind) = (tenant.to_string(), kind.to_string());
        self.read(move |conn| list_in(conn, &tenant, &kind, limit))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(
        key: &StateKey,
        version: u64,
        data: serde_json::Value,
        applied: &[&str],
    ) -> StateRecord {
        StateRecord {
            key: key.clone(),
            version,
            data,
            applied: applied.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn write(record: StateRecord, expected_version: u64) -> StateWrite {
        StateWrite {
            record,
            expected_version,
        }
    }

    #[tokio::test]
    async fn creates_the_file_with_wal_and_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(&dir.path().join("nested")).unwrap();
        assert_eq!(store.path(), dir.path().join("nested").join(STATE_DB_FILE));
        let conn = lock(&store.writer);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
    }

    #[tokio::test]
    async fn undecodable_json_is_corrupt_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let key = StateKey::new("t1", "order", "o1");
        let other = StateKey::new("t1", "order", "o2");
        store
            .commit(&[
                write(record(&key, 1, json!({"a": 1}), &[]), 0),
                write(record(&other, 1, json!({"a": 2}), &[]), 0),
            ])
            .await
            .unwrap();
        lock(&store.writer)
            .execute(
                "UPDATE state SET data = '{not json' WHERE pk = ?1",
                [key.pk()],
            )
            .unwrap();
        lock(&store.writer)
            .execute(
                "UPDATE state SET applied = '{}' WHERE pk = ?1",
                [other.pk()],
            )
            .unwrap();
        let err = store.load(std::slice::from_ref(&key)).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt(ref m) if m.contains("t1#order#o1")),
            "{err}"
        );
        let err = store.load(std::slice::from_ref(&other)).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        let err = store.list("t1", "order", 10).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        // The read connection is still usable afterwards.
        let fine = StateKey::new("t1", "order", "o3");
        assert_eq!(
            store.load(std::slice::from_ref(&fine)).await.unwrap()[0],
            StateRecord::missing(fine)
        );
    }

    #[tokio::test]
    async fn malformed_commits_are_refused_before_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let key = StateKey::new("t1", "order", "o1");
        let twice = [
            write(record(&key, 1, json!(1), &[]), 0),
            write(record(&key, 2, json!(2), &[]), 1),
        ];
        assert!(matches!(
            store.commit(&twice).await,
            Err(StoreError::Rejected(_))
        ));
        let same_version = [write(record(&key, 3, json!(1), &[]), 3)];
        assert!(matches!(
            store.commit(&same_version).await,
            Err(StoreError::Rejected(_))
        ));
        assert!(!store.load(&[key]).await.unwrap()[0].exists());
        assert_eq!(store.commit(&[]).await.unwrap(), CommitOutcome::Committed);
        assert!(store.load(&[]).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn version_above_i64_is_refused_and_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let a = StateKey::new("t1", "order", "a");
        let b = StateKey::new("t1", "order", "b");
        let err = store
            .commit(&[
                write(record(&a, 1, json!(1), &[]), 0),
                write(record(&b, u64::MAX, json!(1), &[]), 0),
            ])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Rejected(_)), "{err}");
        let loaded = store.load(&[a, b]).await.unwrap();
        assert!(loaded.iter().all(|r| !r.exists()), "nothing committed");
    }

    #[tokio::test]
    async fn duplicate_keys_in_load_come_back_at_each_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let a = StateKey::new("t1", "order", "a");
        let b = StateKey::new("t1", "order", "b");
        store
            .commit(&[write(record(&a, 1, json!("A"), &["e1"]), 0)])
            .await
            .unwrap();
        let loaded = store
            .load(&[a.clone(), b.clone(), a.clone()])
            .await
            .unwrap();
        assert_eq!(loaded.len(), 3);
        assert_eq!(loaded[0], loaded[2]);
        assert_eq!(loaded[0].data, json!("A"));
        assert_eq!(loaded[1], StateRecord::missing(b));
    }

    #[test]
    fn works_without_a_tokio_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let key = StateKey::new("t1", "sku", "s1");
        let committed = block_on(store.commit(&[write(record(&key, 1, json!({"n": 1}), &[]), 0)]));
        assert_eq!(committed.unwrap(), CommitOutcome::Committed);
        let loaded = block_on(store.load(&[key])).unwrap();
        assert_eq!(loaded[0].version, 1);
    }

    /// Polls a future that never waits (no runtime: everything runs inline).
    fn block_on<F: std::future::Future>(fut: F) -> F::Output {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut fut = std::pin::pin!(fut);
        loop {
            if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }
}
