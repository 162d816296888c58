//! The relay port ([`InboxRelay`]) on SQLite: the inbox's `deliveries` (JSON),
//! `relay_due_ms` and relay lease columns, the partial index `inbox_by_relay_due` of
//! items with a pending delivery (as the sparse GSI on DynamoDB), and the
//! `order_cursor` table of ordered destinations (one row per destination and object).
//!
//! Every write runs in the writer's transaction, so a cursor's read-modify-write is
//! atomic like a conditional write.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::inbox::{item_from_row, ITEM_COLUMNS};
use super::{DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{
    DeliveryStatus, InboxItem, InboxRelay, OrderClaim, OrderGate, OrderPosition, StoreError,
    MAX_ORDER_QUEUE,
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
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS inbox_by_relay_due ON inbox(relay_due_ms) \
           WHERE relay_due_ms IS NOT NULL;
         CREATE TABLE IF NOT EXISTS order_cursor (
             id              TEXT PRIMARY KEY NOT NULL,
             state           TEXT NOT NULL,
             updated_at_ms   INTEGER NOT NULL
         );",
    )?;
    Ok(())
}

/// The stored deliveries column: `NULL` when there are none.
pub(super) fn encode_deliveries(deliveries: &[DeliveryStatus]) -> Result<Option<String>, DbError> {
    if deliveries.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(deliveries)
        .map(Some)
        .map_err(|e| DbError::Malformed(format!("deliveries do not encode: {e}")))
}

pub(super) fn decode_deliveries(
    pk: &str,
    raw: Option<String>,
) -> Result<Vec<DeliveryStatus>, DbError> {
    match raw {
        None => Ok(Vec::new()),
        Some(raw) => serde_json::from_str(&raw)
            .map_err(|e| DbError::Corrupt(format!("inbox item {pk}: deliveries: {e}"))),
    }
}

/// A relay may take the item: finished processing and no live relay lease.
const CLAIM_RELAY: &str = "UPDATE inbox SET relay_lease_owner = ?2, relay_lease_until_ms = ?3 \
     WHERE pk = ?1 AND state IN ('completed', 'ignored') \
     AND (relay_lease_until_ms IS NULL OR relay_lease_until_ms <= ?4)";

const FINISH_RELAY: &str = "UPDATE inbox SET deliveries = ?3, relay_due_ms = ?4, \
     relay_lease_owner = NULL, relay_lease_until_ms = NULL \
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

fn limit_arg(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// One object's order at one destination, stored as JSON in `order_cursor.state`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Cursor {
    /// The newest position the destination has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivered: Option<OrderPosition>,
    /// Nothing is sent before this time (the window opened by the first queued event).
    #[serde(default)]
    window_until_ms: i64,
    /// The events waiting for their turn, lowest position first.
    #[serde(default)]
    queue: Vec<Queued>,
    /// The key told `Go`: it holds the object (in flight or failing) until released,
    /// so an older event arriving meanwhile waits instead of going out beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Queued {
    position: OrderPosition,
    key: String,
    item: String,
    since_ms: i64,
}

fn load_cursor(conn: &Connection, id: &str) -> Result<Cursor, DbError> {
    let raw: Option<String> = conn
        .prepare_cached("SELECT state FROM order_cursor WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    match raw {
        None => Ok(Cursor::default()),
        Some(raw) => serde_json::from_str(&raw)
            .map_err(|e| DbError::Corrupt(format!("order cursor {id}: {e}"))),
    }
}

fn store_cursor(conn: &Connection, id: &str, cursor: &Cursor, now_ms: i64) -> Result<(), DbError> {
    let raw = serde_json::to_string(cursor)
        .map_err(|e| DbError::Malformed(format!("order cursor {id} does not encode: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO order_cursor (id, state, updated_at_ms) VALUES (?1, ?2, ?3) \
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(params![id, raw, now_ms])?;
    Ok(())
}

/// The cursor step of [`InboxRelay::order_acquire`], pure so the rules are tested alone.
fn acquire(cursor: &mut Cursor, claim: &OrderClaim, now_ms: i64) -> OrderGate {
    cursor
        .queue
        .retain(|q| q.since_ms >= claim.stale_before_ms || q.key == claim.key);
    if let Some(holder) = &cursor.holder {
        if *holder != claim.key && !cursor.queue.iter().any(|q| q.key == *holder) {
            cursor.holder = None;
        }
    }
    if let Some(delivered) = &cursor.delivered {
        if claim.position <= *delivered {
            cursor.queue.retain(|q| q.key != claim.key);
            if cursor.holder.as_deref() == Some(claim.key.as_str()) {
                cursor.holder = None;
            }
            return OrderGate::Superseded {
                delivered: delivered.clone(),
            };
        }
    }
    if !cursor.queue.iter().any(|q| q.key == claim.key) {
        if cursor.queue.len() >= MAX_ORDER_QUEUE {
            // Full: wait outside the queue; the window keeps the retries apart.
            return OrderGate::Wait {
                until_ms: now_ms.saturating_add(claim.window_ms.max(1_000)),
            };
        }
        if cursor.queue.is_empty() {
            cursor.window_until_ms = now_ms.saturating_add(claim.window_ms);
        }
        cursor.queue.push(Queued {
            position: claim.position.clone(),
            key: claim.key.clone(),
            item: claim.item.as_str().to_string(),
            since_ms: now_ms,
        });
        cursor.queue.sort_by(|a, b| a.position.cmp(&b.position));
    }
    if now_ms < cursor.window_until_ms {
        return OrderGate::Wait {
            until_ms: cursor.window_until_ms,
        };
    }
    match (&cursor.holder, cursor.queue.first()) {
        (Some(holder), _) if *holder == claim.key => OrderGate::Go,
        (None, Some(head)) if head.key == claim.key => {
            cursor.holder = Some(claim.key.clone());
            OrderGate::Go
        }
        // Another event of the object goes first; its release hands the turn on, the
        // retry is the fallback should that hand-over be lost.
        _ => OrderGate::Wait {
            until_ms: now_ms.saturating_add(claim.window_ms.max(1_000)),
        },
    }
}

fn release(cursor: &mut Cursor, key: &str, delivered: Option<&OrderPosition>) -> Option<InboxKey> {
    cursor.queue.retain(|q| q.key != key);
    if cursor.holder.as_deref() == Some(key) {
        cursor.holder = None;
    }
    if let Some(position) = delivered {
        if cursor.delivered.as_ref().is_none_or(|d| position > d) {
            cursor.delivered = Some(position.clone());
        }
        // Anything at or below the delivered position is superseded: its own acquire
        // says so; keep it queued only until then would hold nothing back, so drop it.
        let newest = cursor.delivered.clone();
        cursor
            .queue
            .retain(|q| newest.as_ref().is_none_or(|d| q.position > *d));
    }
    cursor
        .queue
        .first()
        .map(|head| InboxKey::from_stored(head.item.clone()))
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
                let sql = format!(
                    "SELECT {ITEM_COLUMNS} FROM inbox INDEXED BY inbox_by_relay_due \
                     WHERE relay_due_ms IS NOT NULL ORDER BY relay_due_ms LIMIT ?1"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let mut rows = stmt.query([limit_arg(limit)])?;
                let mut items = Vec::new();
                while let Some(row) = rows.next()? {
                    let mut item = item_from_row(row)?;
                    item.body = Vec::new();
                    items.push(item);
                }
                Ok(items)
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
        _now_ms: i64,
    ) -> Result<bool, StoreError> {
        let pk = key.as_str().to_string();
        let owner = owner.to_string();
        let encoded = encode_deliveries(deliveries)?;
        Ok(self
            .write(move |conn| {
                let changed = conn.prepare_cached(FINISH_RELAY)?.execute(params![
                    pk,
                    owner,
                    encoded,
                    relay_due_ms
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
                let gate = acquire(&mut cursor, &claim, now_ms);
                if cursor != before {
                    store_cursor(conn, &claim.cursor, &cursor, now_ms)?;
                }
                Ok(gate)
            })
            .await?)
    }

    async fn order_release(
        &self,
        cursor_id: &str,
        key: &str,
        delivered: Option<&OrderPosition>,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        let cursor_id = cursor_id.to_string();
        let key = key.to_string();
        let delivered = delivered.cloned();
        Ok(self
            .write(move |conn| {
                let mut cursor = load_cursor(conn, &cursor_id)?;
                let before = cursor.clone();
                let next = release(&mut cursor, &key, delivered.as_ref());
                if cursor != before {
                    store_cursor(conn, &cursor_id, &cursor, now_ms)?;
                }
                Ok(next)
            })
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, at: i64) -> OrderClaim {
        OrderClaim {
            cursor: "c".into(),
            key: key.into(),
            item: InboxKey::from_stored(format!("p#t#{key}")),
            position: OrderPosition {
                at,
                event_id: key.into(),
            },
            window_ms: 100,
            stale_before_ms: 0,
        }
    }

    #[test]
    fn a_shuffled_burst_goes_lowest_first_after_the_window() {
        let mut c = Cursor::default();
        assert_eq!(
            acquire(&mut c, &claim("v3", 3), 1_000),
            OrderGate::Wait { until_ms: 1_100 }
        );
        assert_eq!(
            acquire(&mut c, &claim("v1", 1), 1_050),
            OrderGate::Wait { until_ms: 1_100 }
        );
        assert!(matches!(
            acquire(&mut c, &claim("v3", 3), 1_100),
            OrderGate::Wait { .. }
        ));
        assert_eq!(acquire(&mut c, &claim("v1", 1), 1_100), OrderGate::Go);
        // The same key asking again gets the same answer.
        assert_eq!(acquire(&mut c, &claim("v1", 1), 1_101), OrderGate::Go);
        let next = release(&mut c, "v1", Some(&claim("v1", 1).position));
        assert_eq!(next, Some(InboxKey::from_stored("p#t#v3")));
        assert_eq!(acquire(&mut c, &claim("v3", 3), 1_200), OrderGate::Go);
        release(&mut c, "v3", Some(&claim("v3", 3).position));
        // A straggler below the delivered position is superseded, never queued.
        assert!(matches!(
            acquire(&mut c, &claim("v2", 2), 1_300),
            OrderGate::Superseded { delivered } if delivered.at == 3
        ));
        assert!(c.queue.is_empty());
    }

    #[test]
    fn an_older_event_arriving_while_one_is_in_flight_waits_then_is_superseded() {
        let mut c = Cursor::default();
        let mut v3 = claim("v3", 3);
        v3.window_ms = 0;
        assert_eq!(acquire(&mut c, &v3, 0), OrderGate::Go);
        let mut v1 = claim("v1", 1);
        v1.window_ms = 0;
        assert!(matches!(acquire(&mut c, &v1, 1), OrderGate::Wait { .. }));
        assert_eq!(acquire(&mut c, &v3, 2), OrderGate::Go);
        release(&mut c, "v3", Some(&v3.position));
        assert!(matches!(
            acquire(&mut c, &v1, 3),
            OrderGate::Superseded { .. }
        ));
        assert!(c.queue.is_empty() && c.holder.is_none());
    }

    #[test]
    fn a_dead_lettered_head_releases_without_advancing() {
        let mut c = Cursor::default();
        acquire(&mut c, &claim("v1", 1), 0);
        acquire(&mut c, &claim("v2", 2), 0);
        assert_eq!(acquire(&mut c, &claim("v1", 1), 200), OrderGate::Go);
        let next = release(&mut c, "v1", None);
        assert_eq!(next, Some(InboxKey::from_stored("p#t#v2")));
        assert_eq!(c.delivered, None);
        assert_eq!(acquire(&mut c, &claim("v2", 2), 200), OrderGate::Go);
    }

    #[test]
    fn a_stale_entry_stops_holding_its_object() {
        let mut c = Cursor::default();
        acquire(&mut c, &claim("lost", 1), 0);
        let mut late = claim("v2", 2);
        late.stale_before_ms = 10;
        acquire(&mut c, &late, 500);
        assert_eq!(acquire(&mut c, &late, 700), OrderGate::Go);
    }
}
