//! The relay port ([`InboxRelay`]) on SQLite: the inbox's `deliveries` (JSON),
//! `relay_due_ms` and relay lease columns, the partial index `inbox_by_relay_due` of
//! items with a pending delivery (as the sparse GSI on DynamoDB), the column
//! `relay_dead_ms` with the partial index `inbox_by_relay_dead` of items with a
//! dead-lettered delivery ([`dead_lettered_at`], as `by_relay_dead`), and the
//! `order_cursor` table of ordered destinations (one row per destination and object).
//!
//! Every write runs in the writer's transaction, so a cursor's read-modify-write is
//! atomic like a conditional write.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::item_row::{encode_deliveries, item_from_row, ITEM_COLUMNS};
use super::{DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::order::{Cursor, Entry, Holder};
use crate::ports::{
    dead_lettered_at, DeliveryStatus, InboxItem, InboxRelay, OrderClaim, OrderGate, OrderPosition,
    OrderRelease, StoreError,
};

/// Added on open when missing (idempotent, so files from before the relay get them).
pub(super) fn ensure_relay_schema(conn: &Connection) -> Result<(), DbError> {
    let has_column: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('inbox') WHERE name = 'relay_due_ms'")?
        .exists([])?;
    if !has_column {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             ALTER TABLE inbox ADD COLUMN deliveries TEXT;
             ALTER TABLE inbox ADD COLUMN relay_due_ms INTEGER;
             ALTER TABLE inbox ADD COLUMN relay_lease_until_ms INTEGER;
             ALTER TABLE inbox ADD COLUMN relay_lease_owner TEXT;
             COMMIT;",
        )?;
    }
    // Added later than the relay's other columns: files from before have none, and
    // their earlier dead-lettered deliveries are not indexed (`replay --bulk` finds them).
    let has_dead: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('inbox') WHERE name = 'relay_dead_ms'")?
        .exists([])?;
    if !has_dead {
        conn.execute_batch("ALTER TABLE inbox ADD COLUMN relay_dead_ms INTEGER;")?;
    }
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS inbox_by_relay_due ON inbox(relay_due_ms) \
           WHERE relay_due_ms IS NOT NULL;
         CREATE INDEX IF NOT EXISTS inbox_by_relay_dead ON inbox(relay_dead_ms) \
           WHERE relay_dead_ms IS NOT NULL;
         CREATE TABLE IF NOT EXISTS order_cursor (
             id              TEXT PRIMARY KEY NOT NULL,
             state           TEXT NOT NULL,
             updated_at_ms   INTEGER NOT NULL
         );",
    )?;
    Ok(())
}

/// A relay may take the item: finished processing and no live relay lease.
const CLAIM_RELAY: &str = "UPDATE inbox SET relay_lease_owner = ?2, relay_lease_until_ms = ?3 \
     WHERE pk = ?1 AND state IN ('completed', 'ignored') \
     AND (relay_lease_until_ms IS NULL OR relay_lease_until_ms <= ?4)";

const FINISH_RELAY: &str = "UPDATE inbox SET deliveries = ?3, relay_due_ms = ?4, \
     relay_dead_ms = ?5, relay_lease_owner = NULL, relay_lease_until_ms = NULL \
     WHERE pk = ?1 AND relay_lease_owner = ?2";

fn keys(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<InboxKey>, DbError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let keys = stmt
        .query_map(args, |r| r.get::<_, String>(0))?
        .map(|pk| pk.map(InboxKey::from_stored))
        .collect::<Result<_, _>>()?;
    Ok(keys)
}

/// Up to `limit` items through the partial index `index`, `condition` (its WHERE and
/// ORDER BY), the body not read at all (an empty blob in its place): a backed-up or
/// failing destination must not make every listing load thousands of bodies.
fn items_without_body(
    conn: &Connection,
    index: &str,
    condition: &str,
    limit: usize,
) -> Result<Vec<InboxItem>, DbError> {
    let columns = ITEM_COLUMNS.replacen(", body,", ", X'' AS body,", 1);
    debug_assert_ne!(columns, ITEM_COLUMNS);
    let sql = format!("SELECT {columns} FROM inbox INDEXED BY {index} WHERE {condition} LIMIT ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([limit_arg(limit)])?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(item_from_row(row)?);
    }
    Ok(items)
}

fn limit_arg(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// One object's order at one destination, stored as JSON in `order_cursor.state`
/// (the rules are [`Cursor`]'s). The layout of the first ordered releases is kept:
/// fields added since default when missing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Stored {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivered: Option<OrderPosition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivered_version: Option<i64>,
    #[serde(default)]
    window_until_ms: i64,
    #[serde(default)]
    queue: Vec<Queued>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder_until_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Queued {
    position: OrderPosition,
    key: String,
    item: String,
    since_ms: i64,
}

impl From<Stored> for Cursor {
    fn from(s: Stored) -> Self {
        Cursor {
            delivered: s.delivered,
            delivered_version: s.delivered_version,
            // A holder from before runs were kept: nobody can prove it, so it lapses.
            holder: match (s.holder, s.holder_run, s.holder_until_ms) {
                (Some(key), Some(run), Some(until_ms)) => Some(Holder { key, run, until_ms }),
                _ => None,
            },
            window_until_ms: Some(s.window_until_ms).filter(|w| *w > 0),
            queue: s
                .queue
                .into_iter()
                .map(|q| {
                    let entry = Entry {
                        item: q.item,
                        position: q.position,
                        since_ms: q.since_ms,
                    };
                    (q.key, entry)
                })
                .collect(),
        }
    }
}

impl From<&Cursor> for Stored {
    fn from(c: &Cursor) -> Self {
        Stored {
            delivered: c.delivered.clone(),
            delivered_version: c.delivered_version,
            window_until_ms: c.window_until_ms.unwrap_or(0),
            queue: c
                .queue
                .iter()
                .map(|(key, e)| Queued {
                    position: e.position.clone(),
                    key: key.clone(),
                    item: e.item.clone(),
                    since_ms: e.since_ms,
                })
                .collect(),
            holder: c.holder.as_ref().map(|h| h.key.clone()),
            holder_run: c.holder.as_ref().map(|h| h.run.clone()),
            holder_until_ms: c.holder.as_ref().map(|h| h.until_ms),
        }
    }
}

fn load_cursor(conn: &Connection, id: &str) -> Result<Cursor, DbError> {
    let raw: Option<String> = conn
        .prepare_cached("SELECT state FROM order_cursor WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    match raw {
        None => Ok(Cursor::default()),
        Some(raw) => serde_json::from_str::<Stored>(&raw)
            .map(Cursor::from)
            .map_err(|e| DbError::Corrupt(format!("order cursor {id}: {e}"))),
    }
}

fn store_cursor(conn: &Connection, id: &str, cursor: &Cursor, now_ms: i64) -> Result<(), DbError> {
    let raw = serde_json::to_string(&Stored::from(cursor))
        .map_err(|e| DbError::Malformed(format!("order cursor {id} does not encode: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO order_cursor (id, state, updated_at_ms) VALUES (?1, ?2, ?3) \
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(params![id, raw, now_ms])?;
    Ok(())
}

#[async_trait]
impl InboxRelay for EmbeddedStore {
    async fn relay_due(&self, now_ms: i64, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        Ok(self
            .read(move |conn| {
                keys(
                    conn,
                    "SELECT pk FROM inbox INDEXED BY inbox_by_relay_due \
                     WHERE relay_due_ms IS NOT NULL AND relay_due_ms <= ?1 \
                     ORDER BY relay_due_ms LIMIT ?2",
                    params![now_ms, limit_arg(limit)],
                )
            })
            .await?)
    }

    async fn relay_pending(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        Ok(self
            .read(move |conn| {
                items_without_body(
                    conn,
                    "inbox_by_relay_due",
                    "relay_due_ms IS NOT NULL ORDER BY relay_due_ms",
                    limit,
                )
            })
            .await?)
    }

    async fn relay_dead(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        Ok(self
            .read(move |conn| {
                items_without_body(
                    conn,
                    "inbox_by_relay_dead",
                    "relay_dead_ms IS NOT NULL ORDER BY relay_dead_ms DESC, pk",
                    limit,
                )
            })
            .await?)
    }

    async fn claim_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<InboxItem>, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        Ok(self
            .write(move |conn| {
                let sql = format!("{CLAIM_RELAY} RETURNING {ITEM_COLUMNS}");
                let mut stmt = conn.prepare_cached(&sql)?;
                let mut rows =
                    stmt.query(params![pk, owner, now_ms.saturating_add(lease_ms), now_ms])?;
                match rows.next()? {
                    Some(row) => Ok(Some(item_from_row(row)?)),
                    None => Ok(None),
                }
            })
            .await?)
    }

    async fn finish_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        deliveries: &[DeliveryStatus],
        relay_due_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        let encoded = encode_deliveries(deliveries)?;
        let dead_ms = dead_lettered_at(deliveries, now_ms);
        Ok(self
            .write(move |conn| {
                let changed = conn.prepare_cached(FINISH_RELAY)?.execute(params![
                    pk,
                    owner,
                    encoded,
                    relay_due_ms,
                    dead_ms
                ])?;
                Ok(changed == 1)
            })
            .await?)
    }

    async fn order_acquire(
        &self,
        claim: &OrderClaim,
        now_ms: i64,
    ) -> Result<OrderGate, StoreError> {
        let claim = claim.clone();
        Ok(self
            .write(move |conn| {
                let mut cursor = load_cursor(conn, &claim.cursor)?;
                let before = cursor.clone();
                let gate = cursor.acquire(&claim, now_ms);
                if cursor != before {
                    store_cursor(conn, &claim.cursor, &cursor, now_ms)?;
                }
                Ok(gate)
            })
            .await?)
    }

    async fn order_release(
        &self,
        release: &OrderRelease,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        let release = release.clone();
        Ok(self
            .write(move |conn| {
                let mut cursor = load_cursor(conn, &release.cursor)?;
                let before = cursor.clone();
                let next = cursor.release(&release);
                if cursor != before {
                    store_cursor(conn, &release.cursor, &cursor, now_ms)?;
                }
                Ok(next)
            })
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_written_before_runs_and_versions_were_kept_still_reads() {
        let old = r#"{"delivered":{"at":3,"event_id":"e3"},"window_until_ms":100,
            "queue":[{"position":{"at":5,"event_id":"e5"},"key":"k5","item":"p#t#e5","since_ms":7}],
            "holder":"k5"}"#;
        let cursor = Cursor::from(serde_json::from_str::<Stored>(old).unwrap());
        assert_eq!(cursor.delivered.as_ref().map(|d| d.at), Some(3));
        assert_eq!(cursor.delivered_version, None, "nothing old is superseded");
        assert_eq!(cursor.holder, None, "an unproven hold lapses");
        assert_eq!(cursor.queue["k5"].item, "p#t#e5");
        let again = Cursor::from(Stored::from(&cursor));
        assert_eq!(again, cursor);
    }
}
