//! Retention on the embedded store: what DynamoDB's TTL and SQS's retention do on
//! AWS, done here by a bounded purge that `einmal serve` runs every minute.
//!
//! A pass deletes, oldest first and at most [`PurgeSettings::max_rows`] rows in all:
//! - inbox items (with their bodies, hints and parked waiters: all are inbox rows)
//!   past their `expires_at` (the provider's retry window + replay margin, see
//!   [`crate::retention`]), through the index `inbox_by_expiry`;
//! - ordered destinations' cursors not written for [`PurgeSettings::cursor_retention_ms`]
//!   (DynamoDB gives them a TTL of at least the longest retention of an item queued on
//!   them: by then every such item has expired);
//! - dead letters older than [`DEAD_LETTER_RETENTION_MS`] (the SQS DLQ's retention).
//!
//! The business records (`state`) and the audit log are never touched. PayPal's
//! certificates expire on their own write (`certs`).
//!
//! Every chunk of [`CHUNK_ROWS`] rows is one job of the group-commit writer, so the
//! receiver's and the processor's writes interleave with a pass instead of waiting for
//! it: a chunk adds a few milliseconds to one batch. Freed pages go back to SQLite's
//! free list and are reused by new rows, so the file plateaus; a file created with
//! `auto_vacuum = INCREMENTAL` (every file this version creates) also hands a large
//! surplus of free pages back to the file system after a pass (a store that once held
//! a burst shrinks again). A file from before keeps `auto_vacuum = NONE` (switching
//! needs a full `VACUUM`, which `einmal store vacuum` runs offline): it plateaus, but
//! does not shrink.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::{DbError, EmbeddedStore};
use crate::ports::StoreError;

/// Rows deleted per writer job.
pub const CHUNK_ROWS: usize = 500;
/// Rows a pass deletes at most, unless configured otherwise.
pub const DEFAULT_MAX_ROWS: usize = 20_000;
/// The defaults, for flags.
pub mod defaults {
    pub const MAX_ROWS: usize = super::DEFAULT_MAX_ROWS;
}
/// How often `einmal serve` purges, unless configured otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Dead letters are kept as long as SQS keeps them in the DLQ (14 days).
pub const DEAD_LETTER_RETENTION_MS: i64 = 14 * 86_400_000;
/// Test only: seconds added to the purge's clock (and to `store stats`' view of
/// it), so a test can age the store without waiting. Never set it in production: a
/// positive value deletes inbox items early, and a deleted item no longer
/// deduplicates a provider's late retry.
pub const CLOCK_OFFSET_ENV: &str = "EINMAL_TEST_CLOCK_OFFSET_SECS";
/// Free pages handed back to the file system per pass at most (4 MiB of 4 KiB pages).
const MAX_VACUUM_PAGES: i64 = 1024;

/// `store_meta` keys: when the last pass ran and the interval it promised.
const LAST_PURGE_KEY: &str = "last_purge_ms";
const PURGE_INTERVAL_KEY: &str = "purge_interval_ms";

/// Idempotent: the expiry index the purge walks and the small table it records its
/// passes in (`store stats` reads them).
pub(super) const PURGE_SCHEMA: &str = "
CREATE INDEX IF NOT EXISTS inbox_by_expiry ON inbox(expires_at);
CREATE INDEX IF NOT EXISTS order_cursor_by_updated ON order_cursor(updated_at_ms);
CREATE TABLE IF NOT EXISTS store_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
);
";

/// What a pass may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeSettings {
    /// Rows one pass deletes at most (all tables together); 0 is treated as 1.
    pub max_rows: usize,
    /// Cursors not written for this long are deleted.
    pub cursor_retention_ms: i64,
    /// Recorded with each pass, so `store stats` can say when the next one is due.
    pub interval: Duration,
}

impl PurgeSettings {
    /// Cursors kept as long as the longest retention an item can have with
    /// `configured_retention_days`.
    pub fn for_retention(configured_retention_days: u32) -> Self {
        let days = crate::retention::longest_retention_days(configured_retention_days);
        PurgeSettings {
            max_rows: DEFAULT_MAX_ROWS,
            cursor_retention_ms: i64::from(days) * 86_400_000,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// What one pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PurgeReport {
    pub inbox_items: u64,
    pub cursors: u64,
    pub dead_letters: u64,
    /// Free pages returned to the file system (`incremental_vacuum`).
    pub vacuumed_pages: u64,
    /// The pass stopped at `max_rows` with more left to delete.
    pub truncated: bool,
}

impl PurgeReport {
    pub fn rows(&self) -> u64 {
        self.inbox_items + self.cursors + self.dead_letters
    }
}

/// The purge's "now": the wall clock, shifted by [`CLOCK_OFFSET_ENV`] in tests.
pub fn purge_clock_ms() -> i64 {
    let offset_secs = std::env::var(CLOCK_OFFSET_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(0);
    crate::time::now_millis().saturating_add(offset_secs.saturating_mul(1000))
}

/// One table's share of a pass: delete up to `limit` rows, oldest first.
#[derive(Debug, Clone, Copy)]
enum Target {
    Inbox,
    Cursors,
    DeadLetters,
}

fn delete_chunk(
    conn: &Connection,
    target: Target,
    now_ms: i64,
    cursor_retention_ms: i64,
    limit: usize,
) -> Result<u64, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let deleted = match target {
        // `expires_at` is in seconds, as DynamoDB's TTL attribute.
        Target::Inbox => conn
            .prepare_cached(
                "DELETE FROM inbox WHERE pk IN \
                 (SELECT pk FROM inbox WHERE expires_at < ?1 ORDER BY expires_at LIMIT ?2)",
            )?
            .execute(params![now_ms / 1000, limit])?,
        Target::Cursors => conn
            .prepare_cached(
                "DELETE FROM order_cursor WHERE id IN \
                 (SELECT id FROM order_cursor WHERE updated_at_ms < ?1 ORDER BY updated_at_ms LIMIT ?2)",
            )?
            .execute(params![now_ms.saturating_sub(cursor_retention_ms), limit])?,
        // Ids grow with time, so the oldest are first in the table.
        Target::DeadLetters => conn
            .prepare_cached(
                "DELETE FROM dead_letter WHERE id IN \
                 (SELECT id FROM dead_letter WHERE sent_at_ms < ?1 ORDER BY id LIMIT ?2)",
            )?
            .execute(params![now_ms.saturating_sub(DEAD_LETTER_RETENTION_MS), limit])?,
    };
    Ok(deleted as u64)
}

/// Hand free pages back to the file system when they are more than a quarter of the
/// file, keeping an eighth of it free for the next inserts; only on a file with
/// `auto_vacuum = INCREMENTAL`.
fn vacuum_surplus(conn: &Connection) -> Result<u64, DbError> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode != 2 {
        return Ok(0);
    }
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    if free <= pages / 4 {
        return Ok(0);
    }
    let release = (free - pages / 8).min(MAX_VACUUM_PAGES);
    conn.execute_batch(&format!("PRAGMA incremental_vacuum({release})"))?;
    let after: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    Ok(u64::try_from(free - after).unwrap_or(0))
}

fn record_pass(conn: &Connection, now_ms: i64, interval: Duration) -> Result<(), DbError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO store_meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?;
    stmt.execute(params![LAST_PURGE_KEY, now_ms])?;
    let interval_ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    stmt.execute(params![PURGE_INTERVAL_KEY, interval_ms])?;
    Ok(())
}

/// The last pass's time and the interval it promised, if a pass ever ran.
pub(super) fn last_pass(conn: &Connection) -> Result<Option<(i64, i64)>, DbError> {
    let read = |key: &str| -> Result<Option<i64>, DbError> {
        Ok(conn
            .prepare_cached("SELECT value FROM store_meta WHERE key = ?1")?
            .query_row([key], |r| r.get(0))
            .optional()?)
    };
    Ok(match (read(LAST_PURGE_KEY)?, read(PURGE_INTERVAL_KEY)?) {
        (Some(at), Some(interval)) => Some((at, interval)),
        _ => None,
    })
}

impl EmbeddedStore {
    /// One purge pass as of `now_ms` (see the module documentation).
    pub async fn purge_expired(
        &self,
        now_ms: i64,
        settings: &PurgeSettings,
    ) -> Result<PurgeReport, StoreError> {
        let mut report = PurgeReport::default();
        let mut budget = settings.max_rows.max(1);
        let retention = settings.cursor_retention_ms;
        for target in [Target::Inbox, Target::Cursors, Target::DeadLetters] {
            loop {
                let limit = budget.min(CHUNK_ROWS);
                let deleted = self
                    .write_ordered(move |conn| delete_chunk(conn, target, now_ms, retention, limit))
                    .await?;
                match target {
                    Target::Inbox => report.inbox_items += deleted,
                    Target::Cursors => report.cursors += deleted,
                    Target::DeadLetters => report.dead_letters += deleted,
                }
                budget -= deleted as usize;
                if budget == 0 {
                    report.truncated = true;
                    break;
                }
                if (deleted as usize) < limit {
                    break;
                }
                // Let the receiver's and the processor's writes go first.
                tokio::task::yield_now().await;
            }
            if report.truncated {
                break;
            }
        }
        let interval = settings.interval;
        // Durable: the pass's deletes are fsynced with it.
        report.vacuumed_pages = self
            .write(move |conn| {
                let pages = vacuum_surplus(conn)?;
                record_pass(conn, now_ms, interval)?;
                Ok(pages)
            })
            .await?;
        Ok(report)
    }
}

/// `einmal serve`'s purge: a pass at start, then one every `settings.interval`, until
/// `stop` resolves. A failed pass is logged and the next one tries again.
pub async fn run_purge_loop(
    store: Arc<EmbeddedStore>,
    settings: PurgeSettings,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        match store.purge_expired(purge_clock_ms(), &settings).await {
            Ok(report) if report.rows() > 0 || report.vacuumed_pages > 0 => tracing::info!(
                inbox_items = report.inbox_items,
                cursors = report.cursors,
                dead_letters = report.dead_letters,
                vacuumed_pages = report.vacuumed_pages,
                truncated = report.truncated,
                "embedded store: purged expired rows"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "embedded store: purge failed; retried next pass"),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::Connection;

    use super::*;
    use crate::adapters::embedded::tests::{item, msg, open};
    use crate::ports::{Inbox, PutOutcome, Queue};

    const DAY_MS: i64 = 86_400_000;

    fn settings(max_rows: usize) -> PurgeSettings {
        PurgeSettings {
            max_rows,
            ..PurgeSettings::for_retention(30)
        }
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn a_pass_deletes_exactly_what_expired_and_never_business_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        let now = 100 * DAY_MS;
        // Three expired items (one a hint, one parked on a record), two live ones.
        let mut expired = Vec::new();
        for (i, event_type) in ["payment_intent.succeeded", "hint.payment", "order.paid"]
            .iter()
            .enumerate()
        {
            let mut it = item("stripe", "acme", &format!("old_{i}"), now - 40 * DAY_MS);
            it.envelope.event_type = (*event_type).into();
            it.expires_at = now / 1000 - 1 - i as i64;
            assert_eq!(store.put_new(&it).await.unwrap(), PutOutcome::Inserted);
            expired.push(it);
        }
        let mut live = Vec::new();
        for i in 0..2 {
            let mut it = item("stripe", "acme", &format!("new_{i}"), now - DAY_MS);
            it.expires_at = now / 1000 + 1 + i;
            store.put_new(&it).await.unwrap();
            store.send(&msg(&it)).await.unwrap();
            live.push(it);
        }
        let raw = Connection::open(store.path()).unwrap();
        raw.execute_batch(&format!(
            "INSERT INTO order_cursor (id, state, updated_at_ms) VALUES
                ('old', '{{}}', {}), ('fresh', '{{}}', {});
             INSERT INTO dead_letter (body, visible_at_ms, receive_count, sent_at_ms) VALUES
                ('{{}}', 0, 5, {}), ('{{}}', 0, 5, {});
             INSERT INTO state (pk, tenant, kind, id, version, data, applied, updated_at_ms)
                VALUES ('acme#order#o1', 'acme', 'order', 'o1', 1, '{{\"paid\":true}}', '[]', 1);",
            now - 38 * DAY_MS,
            now - 36 * DAY_MS,
            now - 15 * DAY_MS,
            now - 13 * DAY_MS,
        ))
        .unwrap();

        let report = store.purge_expired(now, &settings(1000)).await.unwrap();
        assert_eq!(
            (report.inbox_items, report.cursors, report.dead_letters),
            (3, 1, 1)
        );
        assert!(!report.truncated);
        for it in &expired {
            assert_eq!(store.get(&it.key).await.unwrap(), None);
        }
        for it in &live {
            assert_eq!(store.get(&it.key).await.unwrap().unwrap().body, it.body);
        }
        let cursors: Vec<String> = raw
            .prepare("SELECT id FROM order_cursor")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(cursors, ["fresh"]);
        assert_eq!(count(&raw, "dead_letter"), 1);
        assert_eq!(
            count(&raw, "queue"),
            2,
            "queued messages are not bookkeeping"
        );
        // A business record written long before every retention stays.
        let record: (i64, String) = raw
            .query_row("SELECT version, data FROM state", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(record, (1, r#"{"paid":true}"#.to_string()));

        // A late duplicate of a live item is still deduplicated; an expired one is new
        // again (as after DynamoDB's TTL).
        assert!(matches!(
            store.put_new(&live[0]).await.unwrap(),
            PutOutcome::Duplicate(_)
        ));
        assert_eq!(
            store.put_new(&expired[0]).await.unwrap(),
            PutOutcome::Inserted
        );
        // The pass is recorded for `store stats`.
        let conn = Connection::open(store.path()).unwrap();
        assert_eq!(
            last_pass(&conn).unwrap(),
            Some((now, DEFAULT_INTERVAL.as_millis() as i64))
        );
    }

    #[tokio::test]
    async fn a_pass_stops_at_its_row_budget_and_the_next_one_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let now = 100 * DAY_MS;
        for i in 0..7 {
            let mut it = item("stripe", "acme", &format!("e{i}"), 1);
            it.expires_at = 10 + i;
            store.put_new(&it).await.unwrap();
        }
        let first = store.purge_expired(now, &settings(5)).await.unwrap();
        assert_eq!((first.inbox_items, first.truncated), (5, true));
        // Oldest first: the two that expired last are left.
        let raw = Connection::open(store.path()).unwrap();
        let left: Vec<i64> = raw
            .prepare("SELECT expires_at FROM inbox ORDER BY expires_at")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(left, [15, 16]);
        let second = store.purge_expired(now, &settings(5)).await.unwrap();
        assert_eq!((second.inbox_items, second.truncated), (2, false));
        assert_eq!(count(&raw, "inbox"), 0);
    }

    #[tokio::test]
    async fn a_new_file_hands_a_large_free_surplus_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let raw = Connection::open(store.path()).unwrap();
        let mode: i64 = raw
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, 2, "new files are incremental");
        for i in 0..400 {
            let mut it = item("stripe", "acme", &format!("e{i}"), 1);
            it.body = vec![7; 4000];
            it.expires_at = 10;
            store.put_new(&it).await.unwrap();
        }
        let pages = |raw: &Connection| -> i64 {
            raw.query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap()
        };
        let before = pages(&raw);
        let report = store
            .purge_expired(100 * DAY_MS, &settings(1000))
            .await
            .unwrap();
        assert_eq!(report.inbox_items, 400);
        assert!(report.vacuumed_pages > 0, "{report:?}");
        assert!(pages(&raw) < before, "{} < {before}", pages(&raw));
    }
}
