//! One inbox row as an [`InboxItem`]: the columns every reader selects, the decoding
//! of a row and of its `deliveries` JSON. Shared by the inbox, the relay, the search
//! and the sweep, so none of them reaches into another for it.

use rusqlite::{Connection, Row};

use super::DbError;
use crate::envelope::{Envelope, InboxKey};
use crate::ports::{DeliveryStatus, InboxItem, InboxState, Source, Waiting};

pub(super) const ITEM_COLUMNS: &str =
    "pk, provider, tenant, event_id, event_type, object_id, object_version, \
     occurred_at, delivery_id, state, source, attempts, received_at_ms, updated_at_ms, expires_at, \
     enqueue_failed, last_error, body_encoding, body_len, body, last_error_class, lease_until_ms, \
     lease_owner, result, wait_on, waiting_since_ms, deliveries, relay_due_ms";

pub(super) fn get_item(conn: &Connection, pk: &str) -> Result<Option<InboxItem>, DbError> {
    let sql = format!("SELECT {ITEM_COLUMNS} FROM inbox WHERE pk = ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([pk])?;
    match rows.next()? {
        Some(row) => Ok(Some(item_from_row(row)?)),
        None => Ok(None),
    }
}

pub(super) fn item_from_row(row: &Row<'_>) -> Result<InboxItem, DbError> {
    let pk: String = row.get(0)?;
    let state: String = row.get(9)?;
    let source: String = row.get(10)?;
    let attempts: i64 = row.get(11)?;
    let body_len: i64 = row.get(18)?;
    Ok(InboxItem {
        envelope: Envelope {
            provider: row.get(1)?,
            tenant: row.get(2)?,
            event_id: row.get(3)?,
            event_type: row.get(4)?,
            object_id: row.get(5)?,
            object_version: row.get(6)?,
            occurred_at: row.get(7)?,
            delivery_id: row.get(8)?,
        },
        state: InboxState::parse(&state)
            .ok_or_else(|| DbError::Corrupt(format!("inbox item {pk}: unknown state {state:?}")))?,
        source: Source::parse(&source).ok_or_else(|| {
            DbError::Corrupt(format!("inbox item {pk}: unknown source {source:?}"))
        })?,
        attempts: u32::try_from(attempts).map_err(|_| {
            DbError::Corrupt(format!("inbox item {pk}: attempts {attempts} out of range"))
        })?,
        received_at_ms: row.get(12)?,
        updated_at_ms: row.get(13)?,
        expires_at: row.get(14)?,
        enqueue_failed: row.get::<_, i64>(15)? != 0,
        last_error: row.get(16)?,
        body_encoding: row.get(17)?,
        body_len: u64::try_from(body_len).map_err(|_| {
            DbError::Corrupt(format!("inbox item {pk}: body_len {body_len} out of range"))
        })?,
        body: row.get(19)?,
        last_error_class: row.get(20)?,
        lease_until_ms: row.get(21)?,
        lease_owner: row.get(22)?,
        result: row.get(23)?,
        waiting: match (
            row.get::<_, Option<String>>(24)?,
            row.get::<_, Option<i64>>(25)?,
        ) {
            (Some(on), Some(since_ms)) => Some(Waiting { on, since_ms }),
            _ => None,
        },
        deliveries: decode_deliveries(&pk, row.get(26)?)?,
        relay_due_ms: row.get(27)?,
        key: InboxKey::from_stored(pk),
    })
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
