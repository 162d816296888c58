//! [`AuditLog`] on SQLite: `audit.sqlite` in the store directory, append-only.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{params, Connection};

use crate::audit::{limit_or_default, AuditLog, AuditRecord};
use crate::ports::StoreError;

/// File name of the embedded audit log inside the store directory.
const AUDIT_FILE: &str = "audit.sqlite";

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
