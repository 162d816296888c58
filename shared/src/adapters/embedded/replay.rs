//! Operator replay on the embedded store: requeue an inbox item, remove dead letters.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

use super::queue::parse_receipt;
use super::{DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{
    DeadLetterQueue, InboxReplay, InboxState, Queue, QueueError, RequeueOutcome, StoreError,
};

/// Back to `queued`: lease released, attempts, last error and result kept (a forced
/// replay that finds every effect applied keeps the event's result).
const REQUEUE: &str = "UPDATE inbox SET state = 'queued', updated_at_ms = ?2, \
     lease_owner = NULL, lease_until_ms = NULL, enqueue_failed = 0 \
     WHERE pk = ?1";

fn requeue_item(
    conn: &Connection,
    pk: &str,
    force: bool,
    now_ms: i64,
) -> Result<RequeueOutcome, DbError> {
    // Read and write inside the writer's one transaction: atomic.
    let found: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT state, lease_until_ms FROM inbox WHERE pk = ?1")?
        .query_row([pk], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((state, lease_until_ms)) = found else {
        return Ok(RequeueOutcome::Missing);
    };
    let state = InboxState::parse(&state)
        .ok_or_else(|| DbError::Corrupt(format!("inbox item {pk}: unknown state {state:?}")))?;
    match state {
        InboxState::Completed | InboxState::Ignored if !force => {
            return Ok(RequeueOutcome::AlreadyDone(state))
        }
        InboxState::Processing => {
            if let Some(until_ms) = lease_until_ms.filter(|until| *until > now_ms) {
                return Ok(RequeueOutcome::Busy { until_ms });
            }
        }
        _ => {}
    }
    conn.prepare_cached(REQUEUE)?.execute(params![pk, now_ms])?;
    Ok(RequeueOutcome::Requeued { from: state })
}

#[async_trait]
impl InboxReplay for EmbeddedStore {
    async fn requeue(
        &self,
        key: &InboxKey,
        force: bool,
        now_ms: i64,
    ) -> Result<RequeueOutcome, StoreError> {
        let pk = key.as_str().to_string();
        Ok(self
            .write(move |conn| requeue_item(conn, &pk, force, now_ms))
            .await?)
    }
}

#[async_trait]
impl DeadLetterQueue for EmbeddedStore {
    async fn delete_dead_letter(&self, receipt: &str) -> Result<(), QueueError> {
        // Receipts name their table: `ack` deletes from the dead-letter table.
        parse_receipt(receipt)?;
        self.ack(receipt).await
    }

    async fn release_dead_letter(&self, receipt: &str) -> Result<(), QueueError> {
        parse_receipt(receipt)?;
        self.change_visibility(receipt, std::time::Duration::ZERO)
            .await
    }
}
