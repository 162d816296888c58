//! Embedded [`StateStore`]: versioned business records in the `state` table of
//! `dir/einmal.sqlite`, beside the inbox and the queue, written by the same writer
//! thread (see `writer`).
//!
//! # Why one file
//!
//! A business commit used to be its own transaction on its own file
//! (`state.sqlite`) behind a mutex: one fsync per event, and the processor's claim,
//! commit and finish each waited for a different file's commit. On the shared writer
//! the commits of every event in flight (and the receiver's inserts) share one
//! group commit, and one transaction can hold a claim, a business commit and a
//! finish. A `state.sqlite` left by an older version is imported on open
//! ([`import_legacy`]): its rows are copied in one transaction, then the file is
//! renamed aside (`state.sqlite.imported-<unix ms>`), so it is never silently
//! ignored nor imported twice.
//!
//! # Durability and atomicity
//!
//! A commit is a durable write of the group-commit writer: it returns `Committed`
//! only after its transaction is fsynced (`synchronous=FULL`). It runs inside its
//! own savepoint of the batch transaction, which holds the write lock (`BEGIN
//! IMMEDIATE`): it checks every write's expected version (a missing row is version
//! 0) and the version of every record the decision only read ([`ReadCheck`]), and
//! only if all of them still hold upserts every record. Any mismatch writes nothing
//! and answers `Conflict`; an error rolls its savepoint back; so a multi-record
//! commit changes all of its records or none. Two commits of one batch see each
//! other in order: the second one of two racing decisions conflicts.
//!
//! [`StateStore::commit_each`] hands several commits to the writer as one job: each
//! in a savepoint of its own (so each is still all or nothing, and one's conflict
//! or error leaves the others), all under one fsync. The processor gathers a
//! batch's business commits into one such call.
//!
//! # Reads
//!
//! `load` and `list` use the store's read connections (WAL lets them run while the
//! writer commits); a multi-key `load` reads one snapshot (one read transaction).
//! Another process on the same directory (e.g. the CLI) waits up to the store's busy
//! timeout for the write lock, then the call fails as `Unavailable`.
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
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, Row};

use super::{DbError, EmbeddedOptions, EmbeddedStore, BUSY_TIMEOUT};
use crate::domain::state::check_writes;
use crate::domain::state::{
    Commit, CommitAnswer, CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite,
    Waiters, MAX_RECORD_BYTES,
};
use crate::ports::StoreError;
use crate::time::now_millis;

/// The file older versions kept the business records in, imported on open.
pub const LEGACY_STATE_DB_FILE: &str = "state.sqlite";
/// `list` with `limit == 0` returns this many records (as the inbox listing does).
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// The `user_version` of the legacy file this build can import.
const LEGACY_SCHEMA_VERSION: i64 = 1;

/// Insert or replace a record; the import keeps a row already here when it is at
/// least as new (only a crash between an import's commit and its rename can bring
/// the same rows twice).
const UPSERT: &str =
    "INSERT INTO state (pk, tenant, kind, id, version, data, applied, updated_at_ms)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
     ON CONFLICT(pk) DO UPDATE SET
        version = excluded.version,
        data = excluded.data,
        applied = excluded.applied,
        updated_at_ms = excluded.updated_at_ms";

/// Business records in the store's `einmal.sqlite`. Cheap to clone; share it as
/// `Arc<EmbeddedStateStore>` or build one per [`EmbeddedStore`] with
/// [`EmbeddedStateStore::new`].
#[derive(Debug, Clone)]
pub struct EmbeddedStateStore {
    store: Arc<EmbeddedStore>,
}

impl EmbeddedStateStore {
    /// The business records of `store`, on its writer: what `einmal serve` uses, so
    /// that inbox, queue and business writes share group commits.
    pub fn new(store: Arc<EmbeddedStore>) -> Self {
        EmbeddedStateStore { store }
    }

    /// Open (or create) the store in `dir` for its business records alone (tools,
    /// tests). A process that also uses the inbox should share one store
    /// ([`EmbeddedStateStore::new`]): two stores on one file are correct but
    /// take turns at the write lock instead of sharing commits.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Ok(Self::new(Arc::new(EmbeddedStore::open(
            dir,
            EmbeddedOptions::default(),
        )?)))
    }

    /// The database file (`einmal.sqlite`).
    pub fn path(&self) -> &Path {
        self.store.path()
    }

    /// The store the records live in.
    pub fn store(&self) -> &Arc<EmbeddedStore> {
        &self.store
    }
}

/// SQLite's errors of a state write: "too big", constraints and type mismatches
/// never heal (`Rejected`); undecodable values are `Corrupt`; the rest `Unavailable`.
fn db(e: rusqlite::Error) -> DbError {
    match e {
        rusqlite::Error::SqliteFailure(ref f, _)
            if matches!(
                f.code,
                ErrorCode::TooBig | ErrorCode::ConstraintViolation | ErrorCode::TypeMismatch
            ) =>
        {
            DbError::Rejected(format!("state store: {e}"))
        }
        other => DbError::from(other),
    }
}

fn to_i64(v: u64, what: &str, pk: &str) -> Result<i64, DbError> {
    i64::try_from(v).map_err(|_| DbError::Rejected(format!("{pk}: {what} {v} is out of range")))
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
fn decode(row: &Row<'_>) -> Result<StateRecord, DbError> {
    let pk: String = row.get(0)?;
    let corrupt = |what: &str| DbError::Corrupt(format!("state {pk}: {what}"));
    let key = StateKey {
        tenant: row.get(1)?,
        kind: row.get(2)?,
        id: row.get(3)?,
    };
    if key.pk() != pk {
        return Err(corrupt("tenant, kind and id do not match the key"));
    }
    let version: i64 = row.get(4)?;
    let version = u64::try_from(version).map_err(|_| corrupt("negative version"))?;
    let data: String = row.get(5)?;
    let data = serde_json::from_str(&data).map_err(|_| corrupt("data is not JSON"))?;
    let applied: String = row.get(6)?;
    let applied: BTreeSet<String> = serde_json::from_str(&applied)
        .map_err(|_| corrupt("applied is not a JSON array of strings"))?;
    Ok(StateRecord {
        key,
        version,
        data,
        applied,
    })
}

fn load_in(conn: &Connection, keys: &[StateKey]) -> Result<Vec<StateRecord>, DbError> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM state WHERE pk = ?1"))?;
    let mut found: HashMap<String, StateRecord> = HashMap::with_capacity(keys.len());
    for key in keys {
        let pk = key.pk();
        if found.contains_key(&pk) {
            continue;
        }
        let mut rows = stmt.query(params![pk])?;
        if let Some(row) = rows.next()? {
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

/// One commit, inside the writer's batch transaction (which already holds the
/// write lock, so nobody can change a version between the check and the upsert).
fn commit_in(
    conn: &Connection,
    writes: &[StateWrite],
    reads: &[ReadCheck],
) -> Result<CommitOutcome, DbError> {
    let mut current = conn.prepare_cached("SELECT version FROM state WHERE pk = ?1")?;
    let expected = writes
        .iter()
        .map(|w| (&w.record.key, w.expected_version))
        .chain(reads.iter().map(|r| (&r.key, r.version)));
    for (key, version) in expected {
        let stored: Option<i64> = current
            .query_row(params![key.pk()], |r| r.get(0))
            .optional()?;
        if u64::try_from(stored.unwrap_or(0)).ok() != Some(version) {
            // Nothing was written yet.
            return Ok(CommitOutcome::Conflict);
        }
    }
    let mut upsert = conn.prepare_cached(UPSERT)?;
    let now = now_millis();
    for w in writes {
        let r = &w.record;
        let pk = r.key.pk();
        let version = to_i64(r.version, "version", &pk)?;
        let data = serde_json::to_string(&r.data)
            .map_err(|e| DbError::Unavailable(format!("{pk}: data cannot be serialized: {e}")))?;
        let applied = serde_json::to_string(&r.applied).map_err(|e| {
            DbError::Unavailable(format!("{pk}: applied cannot be serialized: {e}"))
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
            .map_err(db)?;
    }
    Ok(CommitOutcome::Committed)
}

/// Several commits in one job of the writer's batch transaction, each in a savepoint
/// of its own: a commit that fails is rolled back alone and answered with its error.
/// Only an error that aborted the whole transaction fails the job.
fn commit_each_in(
    conn: &Connection,
    commits: &[(usize, Commit)],
) -> Result<Vec<Result<CommitOutcome, DbError>>, DbError> {
    let mut outcomes = Vec::with_capacity(commits.len());
    for (_, commit) in commits {
        conn.execute_batch("SAVEPOINT state_commit")?;
        match commit_in(conn, &commit.writes, &commit.reads) {
            Ok(outcome) => {
                conn.execute_batch("RELEASE state_commit")?;
                outcomes.push(Ok(outcome));
            }
            Err(e) => {
                if conn.is_autocommit() {
                    return Err(e);
                }
                conn.execute_batch("ROLLBACK TO state_commit; RELEASE state_commit")?;
                outcomes.push(Err(e));
            }
        }
    }
    Ok(outcomes)
}

fn list_in(
    conn: &Connection,
    tenant: &str,
    kind: &str,
    limit: usize,
) -> Result<Vec<StateRecord>, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM state WHERE tenant = ?1 AND kind = ?2 ORDER BY pk LIMIT ?3"
    ))?;
    let mut rows = stmt.query(params![tenant, kind, limit])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(row)?);
    }
    Ok(out)
}

/// Import the business records of an older version's `dir/state.sqlite` into the
/// writer's `conn` (on open, before the writer thread starts), then rename the old
/// file aside. Its rows are copied verbatim in one transaction (a row already here
/// at a version at least as high is kept); the old file's write lock is held
/// meanwhile so that a writer still running on it cannot slip a commit in between
/// the copy and the rename. A file of an unknown schema version is refused: the
/// store does not open rather than run without those records.
pub(super) fn import_legacy(conn: &Connection, dir: &Path) -> Result<(), StoreError> {
    let legacy = dir.join(LEGACY_STATE_DB_FILE);
    if !legacy.exists() {
        return Ok(());
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Unavailable(format!("{} ({what}): {e}", legacy.display()))
    };
    // Read-write: opening recovers a WAL the old process may have left behind.
    let old = Connection::open_with_flags(
        &legacy,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| fail("cannot open the old state file", &e))?;
    old.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| fail("cannot open the old state file", &e))?;
    old.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| fail("cannot lock the old state file", &e))?;
    let copied = copy_legacy_rows(conn, &old).map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        match e {
            ImportError::Refused(m) => StoreError::Unavailable(format!(
                "{}: {m}; move it out of the store directory to start without it",
                legacy.display()
            )),
            ImportError::Db(e) => fail("cannot import the business records", &e),
        }
    })?;
    // Closing the last connection checkpoints the old WAL into the file and removes it.
    let _ = old.execute_batch("ROLLBACK");
    drop(old);
    let aside = dir.join(format!("{LEGACY_STATE_DB_FILE}.imported-{}", now_millis()));
    std::fs::rename(&legacy, &aside).map_err(|e| fail("cannot rename the old state file", &e))?;
    for suffix in ["-wal", "-shm"] {
        let side = dir.join(format!("{LEGACY_STATE_DB_FILE}{suffix}"));
        if side.exists() {
            let to = dir.join(format!("{}{suffix}", aside.display()));
            std::fs::rename(&side, &to)
                .map_err(|e| fail("cannot rename the old state file", &e))?;
        }
    }
    tracing::warn!(
        records = copied,
        from = %legacy.display(),
        renamed_to = %aside.display(),
        "imported the business records of an older version's state file"
    );
    Ok(())
}

enum ImportError {
    Refused(String),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for ImportError {
    fn from(e: rusqlite::Error) -> Self {
        ImportError::Db(e)
    }
}

/// One transaction on `conn`: every row of `old`'s `state` table. The number copied.
fn copy_legacy_rows(conn: &Connection, old: &Connection) -> Result<u64, ImportError> {
    let version: i64 = old.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let has_table: bool = old.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'state'",
        [],
        |r| r.get(0),
    )?;
    match (version, has_table) {
        (LEGACY_SCHEMA_VERSION, true) => {}
        // Created but never initialised (a crash at its first open): nothing to import.
        (0, false) => return Ok(0),
        (other, _) => {
            return Err(ImportError::Refused(format!(
                "state file of schema version {other}, this build imports version {LEGACY_SCHEMA_VERSION}"
            )))
        }
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let mut upsert = conn.prepare(&format!("{UPSERT} WHERE excluded.version > state.version"))?;
    let mut select = old
        .prepare("SELECT pk, tenant, kind, id, version, data, applied, updated_at_ms FROM state")?;
    let mut rows = select.query([])?;
    let mut copied = 0u64;
    while let Some(row) = rows.next()? {
        let values = (0..8)
            .map(|i| row.get::<_, rusqlite::types::Value>(i))
            .collect::<Result<Vec<_>, _>>()?;
        upsert.execute(rusqlite::params_from_iter(values))?;
        copied += 1;
    }
    drop(rows);
    drop(upsert);
    conn.execute_batch("COMMIT")?;
    Ok(copied)
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
        Ok(self
            .store
            .read(move |conn| {
                // One read transaction = one consistent snapshot across the keys.
                conn.execute_batch("BEGIN DEFERRED")?;
                let result = load_in(conn, &keys);
                let end = conn.execute_batch("COMMIT");
                let records = result?;
                end?;
                Ok(records)
            })
            .await?)
    }

    fn gathers_commits(&self) -> bool {
        true
    }

    /// No marks: every commit answers [`Waiters::Unknown`] (the processor asks the
    /// waiters' index for every changed record; an index lookup here is one local read).
    async fn mark_waited(&self, _key: &StateKey, _keep_until_ms: i64) -> Result<(), StoreError> {
        Ok(())
    }

    /// One durable job for all: the commits share one fsync.
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        // Answered before the writer: empty commits (nothing to make atomic) and
        // malformed or oversized ones (refused as `commit_checked` refuses them).
        let mut answers: Vec<Option<CommitAnswer>> = commits
            .iter()
            .map(|c| {
                if c.writes.is_empty() {
                    return Some(Ok((CommitOutcome::Committed, Waiters::Unknown)));
                }
                check_writes(&c.writes, &c.reads)
                    .and_then(|()| check_sizes(&c.writes))
                    .err()
                    .map(Err)
            })
            .collect();
        let todo: Vec<(usize, Commit)> = commits
            .iter()
            .enumerate()
            .filter(|(i, _)| answers[*i].is_none())
            .map(|(i, c)| (i, c.clone()))
            .collect();
        if !todo.is_empty() {
            let positions: Vec<usize> = todo.iter().map(|(i, _)| *i).collect();
            let done = self
                .store
                .submit(
                    move |conn| commit_each_in(conn, &todo),
                    super::writer::Durability::Effect,
                )
                .await;
            match done {
                Ok(outcomes) => {
                    for (i, outcome) in positions.into_iter().zip(outcomes) {
                        answers[i] = Some(
                            outcome
                                .map(|o| (o, Waiters::Unknown))
                                .map_err(StoreError::from),
                        );
                    }
                }
                Err(e) => {
                    for i in positions {
                        answers[i] = Some(Err(StoreError::from(e.clone())));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| Err(StoreError::Unavailable("commit was not answered".into())))
            })
            .collect()
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
        Ok(self
            .store
            .read(move |conn| list_in(conn, &tenant, &kind, limit))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::schema::STATE_SCHEMA;
    use crate::adapters::embedded::DB_FILE;
    use crate::domain::state::CommitOne;
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
    async fn records_live_in_the_store_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStateStore::open(&dir.path().join("nested")).unwrap();
        assert_eq!(store.path(), dir.path().join("nested").join(DB_FILE));
        let key = StateKey::new("t1", "order", "o1");
        store
            .commit(&[write(record(&key, 1, json!({"a": 1}), &["e1"]), 0)])
            .await
            .unwrap();
        let raw = Connection::open(store.path()).unwrap();
        let version: i64 = raw
            .query_row("SELECT version FROM state WHERE pk = ?1", [key.pk()], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(version, 1);
        assert!(!dir
            .path()
            .join("nested")
            .join(LEGACY_STATE_DB_FILE)
            .exists());
    }

    #[tokio::test]
    async fn a_shared_store_commits_records_with_the_inbox_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let state = EmbeddedStateStore::new(store.clone());
        let before = store.commit_stats();
        let key = StateKey::new("t1", "order", "o1");
        state
            .commit(&[write(record(&key, 1, json!(1), &[]), 0)])
            .await
            .unwrap();
        let after = store.commit_stats();
        assert_eq!(after.commits, before.commits + 1);
        assert_eq!(
            after.fsynced,
            before.fsynced + 1,
            "a business commit is fsynced"
        );
        assert_eq!(after.fsynced_effects, before.fsynced_effects + 1);
        assert_eq!(state.load(&[key]).await.unwrap()[0].version, 1);
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
        let raw = Connection::open(store.path()).unwrap();
        raw.execute(
            "UPDATE state SET data = '{not json' WHERE pk = ?1",
            [key.pk()],
        )
        .unwrap();
        raw.execute(
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

    /// A `state.sqlite` as an older version left it: WAL mode, schema version 1, the
    /// last commit still in the WAL only (its process was killed: no checkpoint).
    fn legacy_file(dir: &Path, version: i64, rows: &[(&StateKey, i64, &str)]) {
        let conn = Connection::open(dir.join(LEGACY_STATE_DB_FILE)).unwrap();
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = 0; {STATE_SCHEMA} PRAGMA user_version = {version};"
        ))
        .unwrap();
        for (key, version, data) in rows {
            conn.execute(
                "INSERT INTO state (pk, tenant, kind, id, version, data, applied, updated_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, '[\"e1\"]', 1)",
                params![key.pk(), key.tenant, key.kind, key.id, version, data],
            )
            .unwrap();
        }
    }

    fn imported_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(LEGACY_STATE_DB_FILE))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_legacy_state_file_is_imported_once_and_renamed_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            StateKey::new("t1", "order", "a"),
            StateKey::new("t1", "sku", "b"),
        );
        legacy_file(
            dir.path(),
            1,
            &[(&a, 2, r#"{"status":"paid"}"#), (&b, 1, r#"{"stock":3}"#)],
        );
        assert!(dir
            .path()
            .join(format!("{LEGACY_STATE_DB_FILE}-wal"))
            .exists());
        {
            let store = EmbeddedStateStore::open(dir.path()).unwrap();
            let loaded = store.load(&[a.clone(), b.clone()]).await.unwrap();
            assert_eq!(loaded[0], record(&a, 2, json!({"status": "paid"}), &["e1"]));
            assert_eq!(loaded[1], record(&b, 1, json!({"stock": 3}), &["e1"]));
            let names = imported_files(dir.path());
            assert_eq!(names.len(), 1, "{names:?}");
            assert!(names[0].starts_with("state.sqlite.imported-"), "{names:?}");
            // The guards hold on the imported records.
            assert_eq!(
                store
                    .commit(&[write(record(&a, 1, json!({}), &[]), 0)])
                    .await
                    .unwrap(),
                CommitOutcome::Conflict
            );
            store
                .commit(&[write(record(&a, 3, json!({"status": "shipped"}), &[]), 2)])
                .await
                .unwrap();
        }
        // The renamed file holds every row (its WAL was folded in), and is not read again.
        let aside = dir.path().join(&imported_files(dir.path())[0]);
        let old = Connection::open(&aside).unwrap();
        let rows: i64 = old
            .query_row("SELECT count(*) FROM state", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2);
        drop(old);
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        assert_eq!(store.load(&[a]).await.unwrap()[0].version, 3);
    }

    #[tokio::test]
    async fn an_import_repeated_after_a_crash_keeps_newer_records() {
        // A crash between the import's commit and its rename: the next open copies the
        // rows again; records changed since keep their newer versions.
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            StateKey::new("t1", "order", "a"),
            StateKey::new("t1", "order", "b"),
        );
        {
            let store = EmbeddedStateStore::open(dir.path()).unwrap();
            store
                .commit(&[write(record(&a, 5, json!("new"), &[]), 0)])
                .await
                .unwrap();
        }
        legacy_file(dir.path(), 1, &[(&a, 4, r#""old""#), (&b, 1, r#""b""#)]);
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let loaded = store.load(&[a.clone(), b.clone()]).await.unwrap();
        assert_eq!(loaded[0], record(&a, 5, json!("new"), &[]));
        assert_eq!(loaded[1].version, 1);
    }

    #[tokio::test]
    async fn a_legacy_file_of_an_unknown_version_stops_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let a = StateKey::new("t1", "order", "a");
        legacy_file(dir.path(), 7, &[(&a, 1, "1")]);
        let err = EmbeddedStateStore::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, StoreError::Unavailable(ref m)
                if m.contains("state.sqlite") && m.contains("schema version 7")),
            "{err}"
        );
        assert!(
            dir.path().join(LEGACY_STATE_DB_FILE).exists(),
            "left in place"
        );
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let rows: i64 = raw
            .query_row("SELECT count(*) FROM state", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0, "nothing imported");
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
