//! The store's figures for `einmal store stats` and `/metrics`: rows per table, the
//! file and WAL sizes, the oldest item and the purge's schedule.
//!
//! Counting rows reads a whole index per table (SQLite keeps no row count), so a
//! caller that asks often (`/metrics`) caches the answer.

use std::path::Path;

use rusqlite::Connection;
use serde::Serialize;

use super::{purge, schema, DbError, EmbeddedStore};
use crate::ports::StoreError;

/// The tables of `einmal.sqlite`, in the order `stats` lists them.
pub const TABLES: [&str; 6] = [
    "inbox",
    "queue",
    "dead_letter",
    "order_cursor",
    "state",
    "certificates",
];

/// One table's row count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableRows {
    pub table: String,
    pub rows: u64,
}

/// The store's figures at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    pub schema_version: i64,
    pub tables: Vec<TableRows>,
    /// The database file and its WAL, in bytes (0 when there is no WAL file).
    pub file_bytes: u64,
    pub wal_bytes: u64,
    pub page_size: u64,
    pub page_count: u64,
    /// Pages on the free list: space new rows reuse before the file grows.
    pub free_pages: u64,
    /// `none`, `full` or `incremental`.
    pub auto_vacuum: String,
    /// The oldest inbox item's receipt (ms) and the earliest expiry (s), if any item.
    pub oldest_item_received_ms: Option<i64>,
    pub next_expiry_secs: Option<i64>,
    /// When the last purge pass ran (ms) and when the next is due (ms), if one ran.
    pub last_purge_ms: Option<i64>,
    pub next_purge_ms: Option<i64>,
}

impl StoreStats {
    pub fn rows(&self, table: &str) -> Option<u64> {
        self.tables
            .iter()
            .find(|t| t.table == table)
            .map(|t| t.rows)
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn read_stats(conn: &Connection, path: &Path) -> Result<StoreStats, DbError> {
    // One read transaction: the counts and the bounds are of one snapshot.
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let number = |sql: &str| -> Result<i64, DbError> {
            Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))?)
        };
        let optional = |sql: &str| -> Result<Option<i64>, DbError> {
            Ok(conn.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))?)
        };
        let mut tables = Vec::with_capacity(TABLES.len());
        for table in TABLES {
            let rows = number(&format!("SELECT count(*) FROM {table}"))?;
            tables.push(TableRows {
                table: table.to_string(),
                rows: u64::try_from(rows).unwrap_or(0),
            });
        }
        let auto_vacuum = match number("PRAGMA auto_vacuum")? {
            0 => "none",
            1 => "full",
            _ => "incremental",
        };
        let last = purge::last_pass(conn)?;
        Ok(StoreStats {
            schema_version: number("PRAGMA user_version")?,
            tables,
            file_bytes: file_len(path),
            wal_bytes: file_len(&wal_path(path)),
            page_size: u64::try_from(number("PRAGMA page_size")?).unwrap_or(0),
            page_count: u64::try_from(number("PRAGMA page_count")?).unwrap_or(0),
            free_pages: u64::try_from(number("PRAGMA freelist_count")?).unwrap_or(0),
            auto_vacuum: auto_vacuum.to_string(),
            oldest_item_received_ms: optional("SELECT min(received_at_ms) FROM inbox")?,
            next_expiry_secs: optional("SELECT min(expires_at) FROM inbox")?,
            last_purge_ms: last.map(|(at, _)| at),
            next_purge_ms: last.map(|(at, interval)| at.saturating_add(interval)),
        })
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

/// The WAL file next to `db`.
pub fn wal_path(db: &Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

impl EmbeddedStore {
    /// The store's figures (see [`StoreStats`]); reads every table's index once.
    pub async fn stats(&self) -> Result<StoreStats, StoreError> {
        let path = self.path.clone();
        Ok(self.read(move |conn| read_stats(conn, &path)).await?)
    }

    /// The schema version this build writes.
    pub fn schema_version() -> i64 {
        schema::SCHEMA_VERSION
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::tests::{item, msg, open};
    use crate::adapters::embedded::PurgeSettings;
    use crate::ports::{Inbox, Queue};

    #[tokio::test]
    async fn stats_count_rows_and_show_the_purge_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let empty = store.stats().await.unwrap();
        assert_eq!(empty.rows("inbox"), Some(0));
        assert_eq!(empty.oldest_item_received_ms, None);
        assert_eq!(empty.next_purge_ms, None);
        assert_eq!(empty.schema_version, EmbeddedStore::schema_version());
        for (i, at) in [5_000, 3_000, 9_000].into_iter().enumerate() {
            let it = item("stripe", "acme", &format!("e{i}"), at);
            store.put_new(&it).await.unwrap();
            store.send(&msg(&it)).await.unwrap();
        }
        let settings = PurgeSettings::for_retention(30);
        store.purge_expired(1_000, &settings).await.unwrap();
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.rows("inbox"), Some(3));
        assert_eq!(stats.rows("queue"), Some(3));
        assert_eq!(stats.rows("state"), Some(0));
        assert_eq!(stats.oldest_item_received_ms, Some(3_000));
        assert_eq!(stats.next_expiry_secs, Some(3 + 86_400));
        assert_eq!(stats.last_purge_ms, Some(1_000));
        assert_eq!(stats.next_purge_ms, Some(61_000));
        assert!(stats.file_bytes > 0 && stats.page_count > 0);
        assert_eq!(stats.auto_vacuum, "incremental");
    }
}
