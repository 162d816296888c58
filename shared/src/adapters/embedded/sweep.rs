//! [`InboxSweep`] on SQLite (stuck and waiting items), and the start-up send of
//! items a killed process stored but never enqueued.

use async_trait::async_trait;
use rusqlite::{params, Connection};

use super::item_row::{item_from_row, ITEM_COLUMNS};
use super::queue::send_message;
use super::{waiting, DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{InboxItem, InboxState, InboxSweep, QueueMessage, StoreError, WaitingScan};

/// The sweeper's index: per state, oldest update first.
pub(super) const SWEEP_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS inbox_by_state_updated ON inbox(state, updated_at_ms);";

/// One indexed range per state; a `processing` item's lease starts at its last
/// update, so `updated_at_ms < ?1` holds whenever the lease ran out before `?1`.
fn stuck_items(
    conn: &Connection,
    older_than_ms: i64,
    limit: usize,
) -> Result<Vec<InboxItem>, DbError> {
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut items = Vec::new();
    for state in [
        InboxState::Received,
        InboxState::Queued,
        InboxState::Retryable,
        InboxState::Processing,
    ] {
        let lease = if state == InboxState::Processing {
            " AND (lease_until_ms IS NULL OR lease_until_ms < ?2)"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {ITEM_COLUMNS} FROM inbox INDEXED BY inbox_by_state_updated \
             WHERE state = ?1 AND updated_at_ms < ?2{lease} ORDER BY updated_at_ms LIMIT ?3"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(params![state.as_str(), older_than_ms, limit_sql])?;
        while let Some(row) = rows.next()? {
            items.push(item_from_row(row)?);
        }
    }
    items.sort_by(|a, b| {
        a.updated_at_ms
            .cmp(&b.updated_at_ms)
            .then_with(|| a.key.cmp(&b.key))
    });
    items.truncate(limit);
    Ok(items)
}

/// Items [`EmbeddedStore::enqueue_unsent`] sends per write transaction.
const UNSENT_BATCH: usize = 512;
/// Transactions [`EmbeddedStore::enqueue_unsent`] runs at most (about 500,000 items);
/// the sweeper sends whatever is left after that.
const UNSENT_MAX_ROUNDS: usize = 1_000;

impl EmbeddedStore {
    /// Send the pointer of every `received` item, oldest first; returns how many.
    ///
    /// Here an item is `received` only between its put and its send (the send moves
    /// it to `queued` in the same transaction), so when `einmal serve` starts, before it
    /// accepts requests, these are the events a killed process stored but never
    /// enqueued. Sending them at once beats waiting for the sweeper's threshold; an
    /// item another process (a CLI) is about to send gets two pointers, and the
    /// second costs one refused claim, never a second effect.
    pub async fn enqueue_unsent(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        for _ in 0..UNSENT_MAX_ROUNDS {
            let sent = self
                .write(|conn| enqueue_unsent_batch(conn, UNSENT_BATCH))
                .await?;
            total += sent;
            if sent < UNSENT_BATCH {
                break;
            }
        }
        Ok(total)
    }
}

/// One transaction of [`EmbeddedStore::enqueue_unsent`]: up to `limit` items.
fn enqueue_unsent_batch(conn: &Connection, limit: usize) -> Result<usize, DbError> {
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let pks: Vec<String> = conn
        .prepare_cached(
            "SELECT pk FROM inbox INDEXED BY inbox_by_state_updated \
             WHERE state = 'received' ORDER BY updated_at_ms LIMIT ?1",
        )?
        .query_map([limit_sql], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for pk in &pks {
        let message = QueueMessage {
            pk: InboxKey::from_stored(pk.clone()),
        };
        let body =
            serde_json::to_string(&message).map_err(|e| DbError::Malformed(e.to_string()))?;
        send_message(conn, &message, &body)?;
    }
    Ok(pks.len())
}

#[async_trait]
impl InboxSweep for EmbeddedStore {
    async fn stuck(&self, older_than_ms: i64, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self
            .read(move |conn| stuck_items(conn, older_than_ms, limit))
            .await?)
    }

    async fn waiting(
        &self,
        due_before_ms: i64,
        limit: usize,
        read_max: usize,
    ) -> Result<WaitingScan, StoreError> {
        Ok(self
            .read(move |conn| waiting::waiting_scan(conn, due_before_ms, limit, read_max))
            .await?)
    }
}
