//! The relay's per-object order cursors on DynamoDB: one small item per ordered
//! destination and object in the inbox table (pk `cursor#{destination}#{provider}#
//! {tenant}#{object}`), holding the last delivered position and newest version, the run
//! that holds the object (its delivery is in flight), the window of a shuffled burst
//! and the queue of waiting keys (a map by delivery key, at most [`MAX_ORDER_QUEUE`]
//! entries). The rules are [`crate::order::Cursor`]'s, shared with the embedded store.
//!
//! Each step is a consistent GetItem, the decision, and one UpdateItem conditional on
//! the version read (`cursor_version`): two relays racing on one object retry on the
//! new state, no transaction. A step that changes nothing (the same run asking again)
//! writes nothing. Cursors carry the table's TTL, refreshed by every write, never
//! shorter than the retention of any item that queued on it (its claim's
//! `retain_until_secs`) nor than the longest provider retry window plus the replay
//! margin: idle objects' cursors go away (nothing grows with traffic) while a late
//! event or a replay of a live object still meets its cursor.
//!
//! [`MAX_ORDER_QUEUE`]: crate::ports::MAX_ORDER_QUEUE

use aws_sdk_dynamodb::types::AttributeValue;

use super::error::{self, describe};
use super::item::{self, n_attr, s_attr, Item};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::order::{Cursor, Entry, Holder};
use crate::ports::{OrderClaim, OrderGate, OrderPosition, OrderRelease, StoreError};

const VERSION: &str = "cursor_version";
const DELIVERED_AT: &str = "delivered_at";
const DELIVERED_RECEIVED: &str = "delivered_received_ms";
const DELIVERED_ID: &str = "delivered_id";
const DELIVERED_EVENT_VERSION: &str = "delivered_event_version";
const NEWEST_VERSION: &str = "newest_version";
const HOLDER: &str = "holder";
const HOLDER_RUN: &str = "holder_run";
const HOLDER_UNTIL_MS: &str = "holder_until_ms";
const WINDOW_UNTIL_MS: &str = "window_until_ms";
const QUEUE: &str = "queue";
// One queue entry (a map).
const E_ITEM: &str = "item";
const E_AT: &str = "at";
const E_RECEIVED: &str = "received_ms";
const E_ID: &str = "id";
const E_VERSION: &str = "version";
const E_SINCE: &str = "since_ms";

/// Conflicting writers retried before the step gives up (the relay tries again later).
const MAX_CONFLICTS: usize = 8;

/// The shortest a cursor lives after its last write: longer than the longest provider
/// retry window plus the replay margin.
fn cursor_ttl_secs() -> i64 {
    let days = crate::providers::all()
        .iter()
        .map(|p| p.retry_window_days())
        .max()
        .unwrap_or(1)
        + crate::retention::REPLAY_MARGIN_DAYS;
    i64::from(days) * 86_400
}

/// A cursor as stored: its rules' state, the version it was read at (0 = not stored
/// yet) and its expiry (Unix seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Stored {
    version: i64,
    expires_at: i64,
    cursor: Cursor,
}

fn cursor_pk(cursor: &str) -> String {
    format!("{}{cursor}", item::CURSOR_PREFIX)
}

fn decode(pk: &str, mut m: Item) -> Result<Stored, StoreError> {
    let bad = |attr: &str, why: &str| {
        StoreError::Corrupt(format!("cursor {pk}: attribute {attr}: {why}"))
    };
    let number = |m: &Item, attr: &str| -> Result<Option<i64>, StoreError> {
        match m.get(attr) {
            None => Ok(None),
            Some(AttributeValue::N(n)) => n
                .parse()
                .map(Some)
                .map_err(|_| bad(attr, "number out of range")),
            Some(_) => Err(bad(attr, "expected a number")),
        }
    };
    let string = |m: &Item, attr: &str| -> Result<Option<String>, StoreError> {
        match m.get(attr) {
            None => Ok(None),
            Some(AttributeValue::S(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(attr, "expected a string")),
        }
    };
    let delivered = match (number(&m, DELIVERED_AT)?, string(&m, DELIVERED_ID)?) {
        (Some(at), Some(event_id)) => Some(OrderPosition {
            at,
            received_ms: number(&m, DELIVERED_RECEIVED)?.unwrap_or(0),
            event_id,
            version: number(&m, DELIVERED_EVENT_VERSION)?,
        }),
        _ => None,
    };
    let holder = match (
        string(&m, HOLDER)?,
        string(&m, HOLDER_RUN)?,
        number(&m, HOLDER_UNTIL_MS)?,
    ) {
        (Some(key), Some(run), Some(until_ms)) => Some(Holder { key, run, until_ms }),
        // A holder from before runs were kept: nobody can prove it, so it lapses.
        _ => None,
    };
    let mut cursor = Cursor {
        delivered,
        delivered_version: number(&m, NEWEST_VERSION)?,
        holder,
        window_until_ms: number(&m, WINDOW_UNTIL_MS)?,
        ..Cursor::default()
    };
    match m.remove(QUEUE) {
        None => {}
        Some(AttributeValue::M(entries)) => {
            for (key, entry) in entries {
                let AttributeValue::M(e) = entry else {
                    return Err(bad(QUEUE, "an entry is not a map"));
                };
                let (Some(item), Some(at), Some(event_id), Some(since_ms)) = (
                    string(&e, E_ITEM)?,
                    number(&e, E_AT)?,
                    string(&e, E_ID)?,
                    number(&e, E_SINCE)?,
                ) else {
                    return Err(bad(QUEUE, "an entry lacks a field"));
                };
                let position = OrderPosition {
                    at,
                    received_ms: number(&e, E_RECEIVED)?.unwrap_or(0),
                    event_id,
                    version: number(&e, E_VERSION)?,
                };
                cursor.queue.insert(
                    key,
                    Entry {
                        item,
                        position,
                        since_ms,
                    },
                );
            }
        }
        Some(_) => return Err(bad(QUEUE, "expected a map")),
    }
    Ok(Stored {
        version: number(&m, VERSION)?.unwrap_or(0),
        expires_at: number(&m, item::EXPIRES_AT)?.unwrap_or(0),
        cursor,
    })
}

fn queue_attr(cursor: &Cursor) -> AttributeValue {
    AttributeValue::M(
        cursor
            .queue
            .iter()
            .map(|(key, e)| {
                let mut entry = Item::from([
                    (E_ITEM.to_string(), s_attr(&e.item)),
                    (E_AT.to_string(), n_attr(e.position.at)),
                    (E_RECEIVED.to_string(), n_attr(e.position.received_ms)),
                    (E_ID.to_string(), s_attr(&e.position.event_id)),
                    (E_SINCE.to_string(), n_attr(e.since_ms)),
                ]);
                if let Some(version) = e.position.version {
                    entry.insert(E_VERSION.to_string(), n_attr(version));
                }
                (key.clone(), AttributeValue::M(entry))
            })
            .collect(),
    )
}

impl AwsStore {
    async fn read_cursor(&self, pk: &str) -> Result<Stored, StoreError> {
        let out = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key(item::PK, s_attr(pk))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem", &e)))?;
        match out.item {
            None => Ok(Stored::default()),
            Some(m) => decode(pk, m),
        }
    }

    /// Write `stored.cursor` if it is still at the version it was read at; `false`
    /// when another writer came first.
    async fn write_cursor(&self, pk: &str, stored: &Stored) -> Result<bool, StoreError> {
        let c = &stored.cursor;
        let numbers = [
            (DELIVERED_AT, c.delivered.as_ref().map(|d| d.at)),
            (
                DELIVERED_RECEIVED,
                c.delivered.as_ref().map(|d| d.received_ms),
            ),
            (
                DELIVERED_EVENT_VERSION,
                c.delivered.as_ref().and_then(|d| d.version),
            ),
            (NEWEST_VERSION, c.delivered_version),
            (HOLDER_UNTIL_MS, c.holder.as_ref().map(|h| h.until_ms)),
            (WINDOW_UNTIL_MS, c.window_until_ms),
        ];
        let strings = [
            (
                DELIVERED_ID,
                c.delivered.as_ref().map(|d| d.event_id.as_str()),
            ),
            (HOLDER, c.holder.as_ref().map(|h| h.key.as_str())),
            (HOLDER_RUN, c.holder.as_ref().map(|h| h.run.as_str())),
        ];
        let mut set = vec!["#version = :next", "#queue = :queue", "#expires = :expires"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        let mut remove = Vec::new();
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, s_attr(pk))
            .expression_attribute_names("#version", VERSION)
            .expression_attribute_names("#queue", QUEUE)
            .expression_attribute_names("#expires", item::EXPIRES_AT)
            .expression_attribute_values(":next", n_attr(stored.version + 1))
            .expression_attribute_values(":queue", queue_attr(c))
            .expression_attribute_values(":expires", n_attr(stored.expires_at));
        request = if stored.version == 0 {
            request
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", item::PK)
        } else {
            request
                .condition_expression("#version = :read")
                .expression_attribute_values(":read", n_attr(stored.version))
        };
        let values = numbers
            .into_iter()
            .map(|(name, v)| (name, v.map(n_attr)))
            .chain(strings.into_iter().map(|(name, v)| (name, v.map(s_attr))));
        for (name, value) in values {
            request = request.expression_attribute_names(format!("#{name}"), name);
            match value {
                Some(value) => {
                    set.push(format!("#{name} = :{name}"));
                    request = request.expression_attribute_values(format!(":{name}"), value);
                }
                None => remove.push(format!("#{name}")),
            }
        }
        let mut expression = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        match request.update_expression(expression).send().await {
            Ok(_) => Ok(true),
            Err(e) => error::refused(e).map(|_| false),
        }
    }

    /// Read, decide with `step`, and write when it changed something (with an expiry
    /// of at least `retain_until_secs`); again on a conflicting writer, up to
    /// [`MAX_CONFLICTS`] times. A missing cursor is only created when `create`.
    async fn cursor_step<R>(
        &self,
        cursor: &str,
        now_ms: i64,
        retain_until_secs: i64,
        create: bool,
        step: impl Fn(&mut Cursor) -> R,
        absent: impl Fn() -> R,
    ) -> Result<R, StoreError> {
        let pk = cursor_pk(cursor);
        for _ in 0..MAX_CONFLICTS {
            let mut stored = self.read_cursor(&pk).await?;
            if stored.version == 0 && !create {
                return Ok(absent());
            }
            let before = stored.cursor.clone();
            let answer = step(&mut stored.cursor);
            if stored.cursor == before {
                return Ok(answer);
            }
            stored.expires_at = stored
                .expires_at
                .max(retain_until_secs)
                .max(now_ms / 1000 + cursor_ttl_secs());
            if self.write_cursor(&pk, &stored).await? {
                return Ok(answer);
            }
        }
        Err(StoreError::Unavailable(format!(
            "order cursor {cursor}: {MAX_CONFLICTS} conflicting writers in a row"
        )))
    }

    pub(super) async fn acquire_order(
        &self,
        claim: &OrderClaim,
        now_ms: i64,
    ) -> Result<OrderGate, StoreError> {
        self.cursor_step(
            &claim.cursor,
            now_ms,
            claim.retain_until_secs,
            true,
            |c| c.acquire(claim, now_ms),
            || OrderGate::Go,
        )
        .await
    }

    pub(super) async fn release_order(
        &self,
        release: &OrderRelease,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        // No cursor: nothing to release, nobody to hand on to.
        self.cursor_step(
            &release.cursor,
            now_ms,
            0,
            false,
            |c| c.release(release),
            || None,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written_and_an_old_one_without_runs_still_reads() {
        let mut cursor = Cursor {
            delivered: Some(OrderPosition {
                at: 3,
                received_ms: 9,
                event_id: "e3".into(),
                version: Some(3),
            }),
            delivered_version: Some(3),
            holder: Some(Holder {
                key: "k5".into(),
                run: "r".into(),
                until_ms: 70,
            }),
            window_until_ms: Some(100),
            ..Cursor::default()
        };
        cursor.queue.insert(
            "k5".into(),
            Entry {
                item: "p#t#e5".into(),
                position: OrderPosition {
                    at: 5,
                    received_ms: 11,
                    event_id: "e5".into(),
                    version: None,
                },
                since_ms: 7,
            },
        );
        let c = &cursor;
        let mut m = Item::from([
            (VERSION.to_string(), n_attr(4)),
            (QUEUE.to_string(), queue_attr(c)),
            (DELIVERED_AT.to_string(), n_attr(3)),
            (DELIVERED_RECEIVED.to_string(), n_attr(9)),
            (DELIVERED_ID.to_string(), s_attr("e3")),
            (DELIVERED_EVENT_VERSION.to_string(), n_attr(3)),
            (NEWEST_VERSION.to_string(), n_attr(3)),
            (HOLDER.to_string(), s_attr("k5")),
            (HOLDER_RUN.to_string(), s_attr("r")),
            (HOLDER_UNTIL_MS.to_string(), n_attr(70)),
            (WINDOW_UNTIL_MS.to_string(), n_attr(100)),
        ]);
        assert_eq!(decode("pk", m.clone()).unwrap().cursor, cursor);
        // Written before versions and runs were kept: no newest version (nothing is
        // superseded), the unproven hold lapses.
        for attr in [
            HOLDER_RUN,
            HOLDER_UNTIL_MS,
            NEWEST_VERSION,
            DELIVERED_EVENT_VERSION,
        ] {
            m.remove(attr);
        }
        let old = decode("pk", m).unwrap();
        assert_eq!((old.version, old.cursor.holder), (4, None));
        assert_eq!(old.cursor.delivered_version, None);
        assert_eq!(old.cursor.queue, cursor.queue);
    }
}
