//! The audit log of manual actions (replays, …): who, when, why, which events,
//! result. Append-only: records are inserted, never updated or deleted.
//!
//! Two adapters: [`EmbeddedAuditLog`] (`audit.sqlite` next to the embedded store)
//! and [`crate::adapters::aws::DynamoAuditLog`] (a DynamoDB table).

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ports::StoreError;

/// File name of the embedded audit log inside the store directory.
pub const AUDIT_FILE: &str = "audit.sqlite";
/// `list` limit when asked for 0.
const DEFAULT_LIMIT: usize = 100;

/// One manual action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Unique, sortable by time (`<at_ms>-<random>`).
    pub id: String,
    pub at_ms: i64,
    /// Who: `$USER` or `--actor`.
    pub actor: String,
    /// `replay`, `replay-bulk`, …
    pub action: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// What was selected: the event, or the bulk filter (JSON).
    pub selector: Value,
    /// Inbox keys the action touched.
    pub events: Vec<String>,
    /// What happened (counts, per-event outcomes).
    pub result: Value,
}

impl AuditRecord {
    /// A fresh id for a record written at `at_ms`.
    pub fn new_id(at_ms: i64) -> String {
        format!("{at_ms:013}-{:016x}", rand::random::<u64>())
    }
}

#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Append a record (refused if its id exists: records are never overwritten).
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `limit` 0 means 100.
    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError>;
}

pub(crate) fn limit_or_default(limit: usize) -> usize {
    if limit == 0 {
        DEFAULT_LIMIT
    } else {
        limit
    }
}

// ---------------------------------------------------------------------------
// Embedded

/// `audit.sqlite` in the store directory: one row per record, the record as JSON.
#[derive(Clone)]
pub struct EmbeddedAuditLog {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for EmbeddedAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedAuditLog").finish_non_exhaustive()
    }
}

fn sqlite_err(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("audit log: {e}"))
}

impl EmbeddedAuditLog {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
        })?;
        let conn = Connection::open(dir.join(AUDIT_FILE)).map_err(sqlite_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sqlite_err)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS audit (
                 id     TEXT PRIMARY KEY NOT NULL,
                 at_ms  INTEGER NOT NULL,
                 record TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS audit_by_time ON audit(at_ms);",
        )
        .map_err(sqlite_err)?;
        Ok(EmbeddedAuditLog {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn
                .lock()
                .map_err(|_| StoreError::Unavailable("audit log: poisoned lock".into()))?;
            work(&conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("audit log task failed: {e}")))?
    }
}

#[async_trait]
impl AuditLog for EmbeddedAuditLog {
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(record)
            .map_err(|e| StoreError::Unavailable(format!("audit record: {e}")))?;
        let (id, at_ms) = (record.id.clone(), record.at_ms);
        self.with(move |conn| {
            // Plain INSERT: a duplicate id fails instead of overwriting.
            conn.execute(
                "INSERT INTO audit (id, at_ms, record) VALUES (?1, ?2, ?3)",
                params![id, at_ms, json],
            )
            .map_err(sqlite_err)?;
            Ok(())
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = i64::try_from(limit_or_default(limit)).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let mut stmt = conn
                .prepare("SELECT record FROM audit ORDER BY at_ms DESC, id DESC LIMIT ?1")
                .map_err(sqlite_err)?;
            let rows = stmt
                .query_map([limit], |r| r.get::<_, String>(0))
                .map_err(sqlite_err)?;
            let mut out = Vec::new();
            for row in rows {
                let text = row.map_err(sqlite_err)?;
                out.push(
                    serde_json::from_str(&text)
                        .map_err(|e| StoreError::Corrupt(format!("audit record: {e}")))?,
                );
            }
            Ok(out)
        })
        .await
    }
}
