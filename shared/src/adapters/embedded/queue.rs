//! [`Queue`] on SQLite: the `queue` and `dead_letter` tables.
//!
//! # Queue semantics (SQS)
//!
//! `receive` delivers visible messages, bumps their receive count, hands out a fresh
//! receipt and hides them for the visibility timeout. A message whose receive count
//! already reached `max_receive_count` is moved to the `dead_letter` table on the
//! next receive attempt instead of being delivered (SQS redrive); it keeps its
//! receive count, as SQS does. Only the latest receipt of a message is valid: `ack`
//! or `change_visibility` with a stale receipt is a no-op. `send` also moves the
//! inbox item from `received` to `queued` in the same transaction.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection};

use serde::{Deserialize, Serialize};

use super::{DbError, EmbeddedStore};
use crate::envelope::InboxKey;
use crate::ports::{Delivery, Queue, QueueError, QueueMessage};
use crate::time::now_millis;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Queue,
    DeadLetter,
}

impl Table {
    fn receipt_tag(self) -> &'static str {
        match self {
            Table::Queue => "q",
            Table::DeadLetter => "d",
        }
    }

    fn select_visible(self) -> &'static str {
        match self {
            Table::Queue => {
                "SELECT id, body, receive_count FROM queue WHERE visible_at_ms <= ?1 \
                 ORDER BY visible_at_ms, id LIMIT ?2"
            }
            Table::DeadLetter => {
                "SELECT id, body, receive_count FROM dead_letter WHERE visible_at_ms <= ?1 \
                 ORDER BY visible_at_ms, id LIMIT ?2"
            }
        }
    }

    fn mark_received(self) -> &'static str {
        match self {
            Table::Queue => {
                "UPDATE queue SET receive_count = receive_count + 1, receipt = ?2, visible_at_ms = ?3 WHERE id = ?1"
            }
            Table::DeadLetter => {
                "UPDATE dead_letter SET receive_count = receive_count + 1, receipt = ?2, visible_at_ms = ?3 \
                 WHERE id = ?1"
            }
        }
    }

    fn delete(self) -> &'static str {
        match self {
            Table::Queue => "DELETE FROM queue WHERE id = ?1 AND receipt = ?2",
            Table::DeadLetter => "DELETE FROM dead_letter WHERE id = ?1 AND receipt = ?2",
        }
    }

    fn change_visibility(self) -> &'static str {
        match self {
            Table::Queue => "UPDATE queue SET visible_at_ms = ?3 WHERE id = ?1 AND receipt = ?2",
            Table::DeadLetter => {
                "UPDATE dead_letter SET visible_at_ms = ?3 WHERE id = ?1 AND receipt = ?2"
            }
        }
    }
}

/// A parsed receipt: `<table tag>.<row id>.<random>`.
pub(super) struct Receipt {
    table: Table,
    id: i64,
}

fn new_receipt(table: Table, id: i64) -> String {
    format!(
        "{}.{id}.{:032x}",
        table.receipt_tag(),
        rand::random::<u128>()
    )
}

pub(super) fn parse_receipt(receipt: &str) -> Result<Receipt, DbError> {
    let malformed =
        || DbError::Malformed(format!("receipt {receipt:?} was not issued by this store"));
    let mut parts = receipt.splitn(3, '.');
    let table = match parts.next() {
        Some("q") => Table::Queue,
        Some("d") => Table::DeadLetter,
        _ => return Err(malformed()),
    };
    let id = parts
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(malformed)?;
    match parts.next() {
        Some(nonce) if !nonce.is_empty() => Ok(Receipt { table, id }),
        _ => Err(malformed()),
    }
}

/// A row's body: the pointer, and how often its event's message was postponed
/// (absent in rows of earlier releases and in every first send).
#[derive(Serialize, Deserialize)]
struct Stored {
    pk: InboxKey,
    #[serde(default, skip_serializing_if = "is_zero")]
    postponed: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn send_message(
    conn: &Connection,
    message: &QueueMessage,
    body: &str,
) -> Result<(), DbError> {
    let now = now_millis();
    conn.prepare_cached(
        "INSERT INTO queue (body, visible_at_ms, receive_count, receipt, sent_at_ms) VALUES (?1, ?2, 0, NULL, ?2)",
    )?
    .execute(params![body, now])?;
    conn.prepare_cached("UPDATE inbox SET state = 'queued', updated_at_ms = ?2 WHERE pk = ?1 AND state = 'received'")?
        .execute(params![message.pk.as_str(), now])?;
    Ok(())
}

/// Move a queue row to the dead-letter table, keeping its body, receive count and
/// send time; it is visible there at once.
fn redrive(conn: &Connection, id: i64, now: i64) -> Result<(), DbError> {
    conn.prepare_cached(
        "INSERT INTO dead_letter (body, visible_at_ms, receive_count, receipt, sent_at_ms) \
         SELECT body, ?2, receive_count, NULL, sent_at_ms FROM queue WHERE id = ?1",
    )?
    .execute(params![id, now])?;
    conn.prepare_cached("DELETE FROM queue WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

fn receive_messages(
    conn: &Connection,
    table: Table,
    max: u32,
    visibility: Duration,
    max_receive_count: u32,
) -> Result<Vec<Delivery>, DbError> {
    let max = max as usize;
    let now = now_millis();
    let visible_at = now.saturating_add(millis(visibility));
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut delivered: HashSet<i64> = HashSet::new();
    loop {
        // With a zero visibility, rows delivered in an earlier round are visible
        // again: ask for enough rows to skip them.
        let want = max - deliveries.len() + delivered.len();
        let rows: Vec<(i64, String, i64)> = {
            let mut stmt = conn.prepare_cached(table.select_visible())?;
            let rows = stmt
                .query_map(params![now, i64::try_from(want).unwrap_or(i64::MAX)], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            rows.collect::<Result<_, _>>()?
        };
        let exhausted = rows.len() < want;
        let mut redriven = 0usize;
        for (id, body, count) in rows {
            if deliveries.len() >= max {
                break;
            }
            if delivered.contains(&id) {
                continue;
            }
            let message = match serde_json::from_str::<Stored>(&body) {
                Ok(stored) => Some(stored),
                Err(e) => {
                    tracing::error!(table = ?table, id, error = %e, "embedded queue: undecodable message");
                    None
                }
            };
            if table == Table::Queue && (message.is_none() || count >= i64::from(max_receive_count))
            {
                redrive(conn, id, now)?;
                redriven += 1;
                continue;
            }
            let receipt = new_receipt(table, id);
            conn.prepare_cached(table.mark_received())?
                .execute(params![id, receipt, visible_at])?;
            let Some(message) = message else {
                // An undecodable dead letter: hidden like a delivered one so it does not
                // block the others, left in place for inspection.
                continue;
            };
            let receive_count = u32::try_from(count.saturating_add(1)).map_err(|_| {
                DbError::Corrupt(format!(
                    "{table:?} message {id}: receive count {count} out of range"
                ))
            })?;
            delivered.insert(id);
            deliveries.push(Delivery {
                message: QueueMessage { pk: message.pk },
                receipt,
                receive_count,
                item: None,
                postponed: message.postponed,
            });
        }
        if deliveries.len() >= max || exhausted || redriven == 0 {
            return Ok(deliveries);
        }
    }
}

fn change_visibility_of(
    conn: &Connection,
    receipt: &Receipt,
    raw: &str,
    visible_at: i64,
) -> Result<(), DbError> {
    conn.prepare_cached(receipt.table.change_visibility())?
        .execute(params![receipt.id, raw, visible_at])?;
    Ok(())
}

impl EmbeddedStore {
    async fn receive_from(
        &self,
        table: Table,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let max_receive_count = self.max_receive_count;
        // Ordered, not durable: a receive lost with a power cut only means the
        // message is delivered again (see `writer`).
        Ok(self
            .write_ordered(move |conn| {
                receive_messages(conn, table, max, visibility, max_receive_count)
            })
            .await?)
    }
}

#[async_trait]
impl Queue for EmbeddedStore {
    /// Enqueue, and move the inbox item from `received` to `queued` in the same
    /// transaction. Ordered, not durable: a send lost with a power cut leaves the item
    /// `received`, which is re-enqueued at the next start and by the sweeper, as after
    /// a crash between the receiver's put and its send (see `writer`).
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let body =
            serde_json::to_string(message).map_err(|e| QueueError::Malformed(e.to_string()))?;
        let message = message.clone();
        Ok(self
            .write_ordered(move |conn| send_message(conn, &message, &body))
            .await?)
    }

    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(Table::Queue, max, visibility).await
    }

    /// Straight into the dead-letter table, visible there at once.
    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let body =
            serde_json::to_string(message).map_err(|e| QueueError::Malformed(e.to_string()))?;
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO dead_letter (body, visible_at_ms, receive_count, receipt, sent_at_ms) \
                 VALUES (?1, ?2, 0, NULL, ?2)",
            )?
            .execute(params![body, now_millis()])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// A stale receipt (the message was received again since) deletes nothing.
    /// Ordered, not durable: a lost delete is a redelivery, which the claim answers
    /// with "finished".
    async fn ack(&self, receipt: &str) -> Result<(), QueueError> {
        let parsed = parse_receipt(receipt)?;
        let raw = receipt.to_string();
        self.write_ordered(move |conn| {
            conn.prepare_cached(parsed.table.delete())?
                .execute(params![parsed.id, raw])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// One write for the whole batch (ordered, as [`Queue::ack`]). A malformed
    /// receipt is reported after the others were deleted.
    async fn ack_batch(&self, receipts: &[String]) -> Result<(), QueueError> {
        let mut parsed = Vec::with_capacity(receipts.len());
        let mut malformed = None;
        for receipt in receipts {
            match parse_receipt(receipt) {
                Ok(p) => parsed.push((p, receipt.clone())),
                Err(e) => malformed = malformed.or(Some(e)),
            }
        }
        if !parsed.is_empty() {
            self.write_ordered(move |conn| {
                for (p, raw) in &parsed {
                    conn.prepare_cached(p.table.delete())?
                        .execute(params![p.id, raw])?;
                }
                Ok(())
            })
            .await?;
        }
        match malformed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// A stale receipt changes nothing. Ordered, not durable: a lost change only
    /// makes the message visible at the receive's visibility timeout instead.
    async fn change_visibility(
        &self,
        receipt: &str,
        visibility: Duration,
    ) -> Result<(), QueueError> {
        let parsed = parse_receipt(receipt)?;
        let raw = receipt.to_string();
        self.write_ordered(move |conn| {
            let visible_at = now_millis().saturating_add(millis(visibility));
            change_visibility_of(conn, &parsed, &raw, visible_at)
        })
        .await?;
        Ok(())
    }

    /// One update of the received row: its body counts the postponement, its receive
    /// count starts again at 0, it is visible after `delay`. A stale receipt changes
    /// nothing (the message was received again since). Ordered, not durable: a lost
    /// update makes the message visible at the receive's visibility timeout instead,
    /// with its receive counted.
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> Result<(), QueueError> {
        let parsed = parse_receipt(&delivery.receipt)?;
        if parsed.table != Table::Queue {
            return Err(QueueError::Malformed(
                "only a work queue message can be postponed".into(),
            ));
        }
        let body = serde_json::to_string(&Stored {
            pk: delivery.message.pk.clone(),
            postponed: delivery.postponed.saturating_add(1),
        })
        .map_err(|e| QueueError::Malformed(e.to_string()))?;
        let raw = delivery.receipt.clone();
        self.write_ordered(move |conn| {
            let visible_at = now_millis().saturating_add(millis(delay));
            conn.prepare_cached(
                "UPDATE queue SET body = ?3, receive_count = 0, visible_at_ms = ?4 \
                 WHERE id = ?1 AND receipt = ?2",
            )?
            .execute(params![parsed.id, raw, body, visible_at])?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(Table::DeadLetter, max, visibility).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::tests::{item, msg, open};
    use crate::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
    use crate::envelope::InboxKey;
    use crate::ports::{Inbox, InboxState};

    #[tokio::test]
    async fn send_dead_letter_goes_straight_to_the_dlq() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("p", "t", "dead", 1);
        store.send_dead_letter(&msg(&a)).await.unwrap();
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
        let dead = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message, msg(&a));
    }

    #[tokio::test]
    async fn send_marks_received_items_queued() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = item("stripe", "acme", "evt_1", 1_000);
        store.put_new(&a).await.unwrap();
        store.send(&msg(&a)).await.unwrap();
        let stored = store.get(&a.key).await.unwrap().unwrap();
        assert_eq!(stored.state, InboxState::Queued);
        assert!(stored.updated_at_ms > a.updated_at_ms);

        // A message whose item does not exist is still enqueued.
        let ghost = QueueMessage {
            pk: InboxKey::new("stripe", "acme", "evt_ghost"),
        };
        store.send(&ghost).await.unwrap();
        let got = store.receive(10, Duration::from_secs(30)).await.unwrap();
        let keys: Vec<_> = got.iter().map(|d| d.message.clone()).collect();
        assert_eq!(keys, vec![msg(&a), ghost]);
        assert_eq!(
            store
                .get(&InboxKey::new("stripe", "acme", "evt_ghost"))
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn receive_hides_messages_and_ack_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for i in 0..3 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("e{i}")),
                })
                .await
                .unwrap();
        }
        assert!(store
            .receive(0, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty());
        let first = store.receive(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].message.pk, InboxKey::new("p", "t", "e0"));
        assert_eq!(first[1].message.pk, InboxKey::new("p", "t", "e1"));
        assert!(first.iter().all(|d| d.receive_count == 1));
        assert_ne!(first[0].receipt, first[1].receipt);

        let second = store.receive(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].message.pk, InboxKey::new("p", "t", "e2"));
        assert!(store
            .receive(10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty());

        for d in first.iter().chain(second.iter()) {
            store.ack(&d.receipt).await.unwrap();
        }
        // Acking twice is harmless.
        store.ack(&first[0].receipt).await.unwrap();
        for d in first.iter().chain(second.iter()) {
            store
                .change_visibility(&d.receipt, Duration::ZERO)
                .await
                .unwrap();
        }
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn change_visibility_zero_makes_a_message_visible_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let m = QueueMessage {
            pk: InboxKey::new("p", "t", "e"),
        };
        store.send(&m).await.unwrap();
        let got = store.receive(1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());

        store
            .change_visibility(&got[0].receipt, Duration::ZERO)
            .await
            .unwrap();
        let again = store.receive(1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message, m);
        assert_eq!(again[0].receive_count, 2);
        assert_ne!(again[0].receipt, got[0].receipt);

        // Extending visibility keeps it hidden.
        store
            .change_visibility(&again[0].receipt, Duration::from_secs(600))
            .await
            .unwrap();
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn stale_receipts_do_not_touch_a_re_received_message() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let m = QueueMessage {
            pk: InboxKey::new("p", "t", "e"),
        };
        store.send(&m).await.unwrap();
        let r1 = store.receive(1, Duration::ZERO).await.unwrap().remove(0);
        let r2 = store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(r2.receive_count, 2);

        store.ack(&r1.receipt).await.unwrap();
        store
            .change_visibility(&r1.receipt, Duration::ZERO)
            .await
            .unwrap();
        // Still there and still hidden under r2.
        assert!(store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        store
            .change_visibility(&r2.receipt, Duration::ZERO)
            .await
            .unwrap();
        let r3 = store
            .receive(1, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(r3.message, m);
        assert_eq!(r3.receive_count, 3);

        store.ack(&r3.receipt).await.unwrap();
        store
            .change_visibility(&r3.receipt, Duration::ZERO)
            .await
            .unwrap();
        assert!(store.receive(1, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn malformed_receipts_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for bad in ["", "x.1.abc", "q.notanumber.abc", "q.1", "q.1."] {
            assert!(
                matches!(store.ack(bad).await, Err(QueueError::Malformed(_))),
                "{bad:?}"
            );
            assert!(
                matches!(
                    store.change_visibility(bad, Duration::ZERO).await,
                    Err(QueueError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn redrive_to_dead_letters_after_max_receive_count() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(
            dir.path(),
            EmbeddedOptions {
                max_receive_count: 2,
            },
        )
        .unwrap();
        let poison = QueueMessage {
            pk: InboxKey::new("p", "t", "poison"),
        };
        let healthy = QueueMessage {
            pk: InboxKey::new("p", "t", "healthy"),
        };
        store.send(&poison).await.unwrap();

        let d1 = store.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(d1.len(), 1);
        assert_eq!(d1[0].receive_count, 1);
        let d2 = store.receive(10, Duration::ZERO).await.unwrap();
        assert_eq!(d2.len(), 1);
        assert_eq!(d2[0].receive_count, 2);
        assert!(store
            .receive_dead_letters(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());

        // The third attempt moves it instead of delivering it; other messages still come.
        store.send(&healthy).await.unwrap();
        let d3 = store.receive(10, Duration::from_secs(60)).await.unwrap();
        assert_eq!(d3.len(), 1);
        assert_eq!(d3[0].message, healthy);
        assert_eq!(d3[0].receive_count, 1);
        // The old receipt no longer reaches it.
        store.ack(&d2[0].receipt).await.unwrap();

        let dead = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message, poison);
        assert_eq!(
            dead[0].receive_count, 3,
            "the receive count carries over, as in SQS"
        );
        assert!(store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());

        // Dead letters are never redriven further, and ack deletes them.
        store
            .change_visibility(&dead[0].receipt, Duration::ZERO)
            .await
            .unwrap();
        for expected in 4..8 {
            let again = store
                .receive_dead_letters(10, Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].receive_count, expected);
        }
        let last = store
            .receive_dead_letters(10, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        store.ack(&last.receipt).await.unwrap();
        store.ack(&d3[0].receipt).await.unwrap();
        assert!(store
            .receive_dead_letters(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        assert!(store.receive(10, Duration::ZERO).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_receive_skips_past_redriven_messages() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(
            dir.path(),
            EmbeddedOptions {
                max_receive_count: 1,
            },
        )
        .unwrap();
        for i in 0..3 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("old{i}")),
                })
                .await
                .unwrap();
        }
        assert_eq!(store.receive(10, Duration::ZERO).await.unwrap().len(), 3);
        for i in 0..2 {
            store
                .send(&QueueMessage {
                    pk: InboxKey::new("p", "t", &format!("new{i}")),
                })
                .await
                .unwrap();
        }
        // The three old ones fill the first select; they go to the DLQ and the receive
        // goes on to deliver the new ones.
        let got = store.receive(2, Duration::ZERO).await.unwrap();
        let keys: Vec<_> = got.iter().map(|d| d.message.pk.clone()).collect();
        assert_eq!(
            keys,
            vec![
                InboxKey::new("p", "t", "new0"),
                InboxKey::new("p", "t", "new1")
            ]
        );
        assert_eq!(
            store
                .receive_dead_letters(10, Duration::from_secs(60))
                .await
                .unwrap()
                .len(),
            3
        );
    }
}
