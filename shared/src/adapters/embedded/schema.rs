//! The SQLite schema of the store's file (`einmal.sqlite`) and its
//! migrations, run by the writer connection on open.

use std::path::Path;

use rusqlite::Connection;

use super::{certs, hints, purge, relay, sweep, waiting, DbError};

/// Stored in `PRAGMA user_version`. Version 2 added the processing columns (lease,
/// error class, result); a version 1 file is upgraded in place on open.
pub(super) const SCHEMA_VERSION: i64 = 2;

/// `WITHOUT ROWID`: the table is clustered on `pk`, and the `(tenant, kind)` index
/// carries `pk`, so `list` reads the index in key order. Idempotent: run on every
/// open by the schema migration (the same table the legacy file had).
pub(super) const STATE_SCHEMA: &str = "
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

/// Version 1 -> 2.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE inbox ADD COLUMN last_error_class TEXT;
ALTER TABLE inbox ADD COLUMN lease_until_ms INTEGER;
ALTER TABLE inbox ADD COLUMN lease_owner TEXT;
ALTER TABLE inbox ADD COLUMN result TEXT;
";

const INBOX_SCHEMA: &str = "
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
";

/// The main queue and the dead-letter queue have one shape (a message moves between them).
fn queue_table(name: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
    id            INTEGER PRIMARY KEY,
    body          TEXT NOT NULL,
    visible_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    receipt       TEXT,
    sent_at_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS {name}_by_visible ON {name}(visible_at_ms);
"
    )
}

/// Every table and index of a new file.
pub(super) fn schema() -> String {
    format!(
        "{INBOX_SCHEMA}{}{}",
        queue_table("queue"),
        queue_table("dead_letter")
    )
}

/// Whether this build can open a file of schema `version` (0 = a new file; older
/// versions are migrated; a newer one is refused: its release may store what this
/// build would misread or lose).
pub(super) fn check_version(version: i64) -> Result<(), DbError> {
    if (0..=SCHEMA_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(DbError::Unavailable(format!(
            "schema version {version} is newer than this build's ({SCHEMA_VERSION}): \
             it was written by a newer einmal; run that release (or newer) on it"
        )))
    }
}

/// Bring the file to [`SCHEMA_VERSION`] (create, upgrade, or refuse a newer one),
/// then the idempotent additions of later features.
pub(super) fn migrate(conn: &Connection, path: &Path) -> Result<(), DbError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    match version {
        SCHEMA_VERSION => {}
        0 => conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;",
            schema()
        ))?,
        1 => conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {MIGRATE_1_TO_2} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))?,
        other => {
            return Err(match check_version(other) {
                Err(DbError::Unavailable(m)) => {
                    DbError::Unavailable(format!("{}: {m}", path.display()))
                }
                _ => DbError::Unavailable(format!(
                    "{} has schema version {other}, which no release wrote",
                    path.display()
                )),
            })
        }
    }
    // Idempotent: also added to files created before the sweeper existed.
    conn.execute_batch(sweep::SWEEP_INDEX)?;
    // Idempotent too: the reconciler's partial index of GoPay / Klarna push hints.
    conn.execute_batch(&hints::hint_index_sql())?;
    // Idempotent too: the waiting columns and the waiters' partial index.
    waiting::ensure_waiting_columns(conn)?;
    // Idempotent too: the relay's columns, its partial index and the order cursors.
    relay::ensure_relay_schema(conn)?;
    // Idempotent too: the business records (in their own file before).
    conn.execute_batch(STATE_SCHEMA)?;
    // Idempotent too: PayPal's verified certificates.
    conn.execute_batch(certs::CERTIFICATE_SCHEMA)?;
    // Idempotent too: the retention purge's indexes and its record of passes.
    conn.execute_batch(purge::PURGE_SCHEMA)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::*;
    use crate::adapters::embedded::tests::{item, open};
    use crate::adapters::embedded::{EmbeddedOptions, EmbeddedStore, DB_FILE};
    use crate::ports::{ClaimOutcome, Inbox, InboxProcessing, InboxState, StoreError};

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
        let v1_schema = schema().replace(
            ",\n    last_error_class TEXT,\n    lease_until_ms INTEGER,\n    lease_owner    TEXT,\n    result         TEXT",
            "",
        );
        assert_ne!(v1_schema, schema());
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
}
