//! The relay's per-object order cursors on DynamoDB: one small item per ordered
//! destination and object in the inbox table (pk `cursor#{destination}#{provider}#
//! {tenant}#{object}`), holding the delivered position, the key that holds the object
//! (its delivery is in flight or failing), the window of a shuffled burst and the queue
//! of waiting keys (a map by delivery key, at most [`MAX_ORDER_QUEUE`] entries).
//!
//! The rules are the embedded store's (`adapters/embedded/relay.rs`), plus an explicit
//! holder: the key that was told `Go` keeps the object until its release, so an older
//! event arriving while it is in flight waits (and is superseded once the holder has
//! delivered) instead of going out beside it: one in flight per object.
//!
//! Each step is a consistent GetItem, the decision in [`Cursor::acquire`] /
//! [`Cursor::release`] (pure, unit-tested), and one UpdateItem conditional on the
//! version read (`cursor_version`): two relays racing on one object retry on the new
//! state, no transaction. A step that changes nothing (the same key asking again)
//! writes nothing. Cursors carry the table's TTL, refreshed by every write and longer
//! than any provider retries, so idle objects' cursors go away (nothing grows with
//! traffic) while a late event of a live object still meets its cursor.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::error::{self, describe};
use super::item::{self, n_attr, s_attr, Item};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{OrderClaim, OrderGate, OrderPosition, StoreError, MAX_ORDER_QUEUE};

const VERSION: &str = "cursor_version";
const DELIVERED_AT: &str = "delivered_at";
const DELIVERED_ID: &str = "delivered_id";
const HOLDER: &str = "holder";
const WINDOW_UNTIL_MS: &str = "window_until_ms";
const QUEUE: &str = "queue";
// One queue entry (a map).
const E_ITEM: &str = "item";
const E_AT: &str = "at";
const E_ID: &str = "id";
const E_SINCE: &str = "since_ms";

/// Conflicting writers retried before the step gives up (the relay tries again later).
const MAX_CONFLICTS: usize = 8;

/// How long a cursor lives after its last write: longer than the longest provider retry
/// window plus the replay margin, so an event can never outlive its object's cursor.
fn cursor_ttl_secs() -> i64 {
    let days = crate::providers::all()
        .iter()
        .map(|p| p.retry_window_days())
        .max()
        .unwrap_or(1)
        + crate::retention::REPLAY_MARGIN_DAYS;
    i64::from(days) * 86_400
}

/// A key waiting for its object's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub item: String,
    pub position: OrderPosition,
    /// When it was queued (Unix ms): entries older than a claim's `stale_before_ms`
    /// are dropped as abandoned.
    pub since_ms: i64,
}

/// One cursor's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cursor {
    /// 0 = not stored yet.
    pub version: i64,
    pub delivered: Option<OrderPosition>,
    pub holder: Option<String>,
    pub window_until_ms: Option<i64>,
    pub queue: BTreeMap<String, Entry>,
}

impl Cursor {
    /// The queued key with the lowest position.
    fn head(&self) -> Option<(&String, &Entry)> {
        self.queue
            .iter()
            .min_by(|a, b| a.1.position.cmp(&b.1.position))
    }

    fn drop_stale(&mut self, stale_before_ms: i64, keep: &str) -> bool {
        let before = self.queue.len();
        self.queue
            .retain(|key, e| key == keep || e.since_ms >= stale_before_ms);
        if self
            .holder
            .as_ref()
            .is_some_and(|h| h != keep && !self.queue.contains_key(h))
        {
            self.holder = None;
        }
        before != self.queue.len()
    }

    /// The decision of [`crate::ports::InboxRelay::order_acquire`]; `true` when the
    /// cursor changed (and must be written).
    pub fn acquire(&mut self, claim: &OrderClaim, now_ms: i64) -> (OrderGate, bool) {
        let mut changed = self.drop_stale(claim.stale_before_ms, &claim.key);
        if let Some(delivered) = &self.delivered {
            if *delivered >= claim.position {
                let delivered = delivered.clone();
                if self.queue.remove(&claim.key).is_some() {
                    changed = true;
                }
                if self.holder.as_deref() == Some(claim.key.as_str()) {
                    self.holder = None;
                    changed = true;
                }
                return (OrderGate::Superseded { delivered }, changed);
            }
        }
        if !self.queue.contains_key(&claim.key) {
            if self.queue.len() >= MAX_ORDER_QUEUE {
                // Full: wait outside the queue and ask again later.
                let retry = now_ms.saturating_add(claim.window_ms.max(1_000));
                return (OrderGate::Wait { until_ms: retry }, changed);
            }
            if self.queue.is_empty() && self.holder.is_none() {
                // The first on an idle object opens the window.
                self.window_until_ms = Some(now_ms.saturating_add(claim.window_ms));
            }
            self.queue.insert(
                claim.key.clone(),
                Entry {
                    item: claim.item.as_str().to_string(),
                    position: claim.position.clone(),
                    since_ms: now_ms,
                },
            );
            changed = true;
        }
        match self.holder.as_deref() {
            Some(holder) if holder == claim.key => return (OrderGate::Go, changed),
            Some(_) => {
                let retry = now_ms.saturating_add(claim.window_ms.max(1_000));
                return (OrderGate::Wait { until_ms: retry }, changed);
            }
            None => {}
        }
        let window = self.window_until_ms.unwrap_or(i64::MIN);
        if now_ms < window {
            return (OrderGate::Wait { until_ms: window }, changed);
        }
        let heads = self.head().is_some_and(|(key, _)| *key == claim.key);
        if heads {
            self.holder = Some(claim.key.clone());
            (OrderGate::Go, true)
        } else {
            // An older event goes first; its release hands the turn on at once.
            let retry = now_ms.saturating_add(claim.window_ms.max(1_000));
            (OrderGate::Wait { until_ms: retry }, changed)
        }
    }

    /// The decision of [`crate::ports::InboxRelay::order_release`]: the key leaves the
    /// queue (and the hold), the delivered position only rises. Returns whether the
    /// cursor changed and the item now heading the queue.
    pub fn release(
        &mut self,
        key: &str,
        delivered: Option<&OrderPosition>,
    ) -> (bool, Option<InboxKey>) {
        let mut changed = self.queue.remove(key).is_some();
        if self.holder.as_deref() == Some(key) {
            self.holder = None;
            changed = true;
        }
        if let Some(position) = delivered {
            if self.delivered.as_ref().is_none_or(|d| d < position) {
                self.delivered = Some(position.clone());
                changed = true;
            }
            // Entries at or below the delivered position are superseded: their own
            // acquire says so; queued they would only hold the turn.
            let before = self.queue.len();
            let newest = self.delivered.clone();
            self.queue
                .retain(|_, e| newest.as_ref().is_none_or(|d| e.position > *d));
            changed |= before != self.queue.len();
        }
        let next = self
            .head()
            .map(|(_, e)| InboxKey::from_stored(e.item.clone()));
        (changed, next)
    }
}

fn cursor_pk(cursor: &str) -> String {
    format!("{}{cursor}", item::CURSOR_PREFIX)
}

fn decode(pk: &str, mut m: Item) -> Result<Cursor, StoreError> {
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
        (Some(at), Some(event_id)) => Some(OrderPosition { at, event_id }),
        _ => None,
    };
    let mut queue = BTreeMap::new();
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
                queue.insert(
                    key,
                    Entry {
                        item,
                        position: OrderPosition { at, event_id },
                        since_ms,
                    },
                );
            }
        }
        Some(_) => return Err(bad(QUEUE, "expected a map")),
    }
    Ok(Cursor {
        version: number(&m, VERSION)?.unwrap_or(0),
        delivered,
        holder: string(&m, HOLDER)?,
        window_until_ms: number(&m, WINDOW_UNTIL_MS)?,
        queue,
    })
}

fn queue_attr(queue: &BTreeMap<String, Entry>) -> AttributeValue {
    AttributeValue::M(
        queue
            .iter()
            .map(|(key, e)| {
                let entry = Item::from([
                    (E_ITEM.to_string(), s_attr(&e.item)),
                    (E_AT.to_string(), n_attr(e.position.at)),
                    (E_ID.to_string(), s_attr(&e.position.event_id)),
                    (E_SINCE.to_string(), n_attr(e.since_ms)),
                ]);
                (key.clone(), AttributeValue::M(entry))
            })
            .collect(),
    )
}

impl AwsStore {
    async fn read_cursor(&self, pk: &str) -> Result<Cursor, StoreError> {
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
            None => Ok(Cursor::default()),
            Some(m) => decode(pk, m),
        }
    }

    /// Write `cursor` if it is still at the version it was read at; `false` when
    /// another writer came first.
    async fn write_cursor(
        &self,
        pk: &str,
        cursor: &Cursor,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut set = vec!["#version = :next", "#queue = :queue", "#expires = :expires"];
        let mut remove = Vec::new();
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, s_attr(pk))
            .expression_attribute_names("#version", VERSION)
            .expression_attribute_names("#queue", QUEUE)
            .expression_attribute_names("#expires", item::EXPIRES_AT)
            .expression_attribute_values(":next", n_attr(cursor.version + 1))
            .expression_attribute_values(":queue", queue_attr(&cursor.queue))
            .expression_attribute_values(":expires", n_attr(now_ms / 1000 + cursor_ttl_secs()));
        request = if cursor.version == 0 {
            request
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", item::PK)
        } else {
            request
                .condition_expression("#version = :read")
                .expression_attribute_values(":read", n_attr(cursor.version))
        };
        request = request
            .expression_attribute_names("#delivered_at", DELIVERED_AT)
            .expression_attribute_names("#delivered_id", DELIVERED_ID);
        match &cursor.delivered {
            Some(d) => {
                set.push("#delivered_at = :delivered_at");
                set.push("#delivered_id = :delivered_id");
                request = request
                    .expression_attribute_values(":delivered_at", n_attr(d.at))
                    .expression_attribute_values(":delivered_id", s_attr(&d.event_id));
            }
            None => remove.extend(["#delivered_at", "#delivered_id"]),
        }
        request = request.expression_attribute_names("#holder", HOLDER);
        match &cursor.holder {
            Some(holder) => {
                set.push("#holder = :holder");
                request = request.expression_attribute_values(":holder", s_attr(holder));
            }
            None => remove.push("#holder"),
        }
        request = request.expression_attribute_names("#window", WINDOW_UNTIL_MS);
        match cursor.window_until_ms {
            Some(until) => {
                set.push("#window = :window");
                request = request.expression_attribute_values(":window", n_attr(until));
            }
            None => remove.push("#window"),
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

    /// Read, decide with `step`, and write when it changed something; again on a
    /// conflicting writer, up to [`MAX_CONFLICTS`] times.
    async fn cursor_step<R>(
        &self,
        cursor: &str,
        now_ms: i64,
        step: impl Fn(&mut Cursor) -> (R, bool),
    ) -> Result<R, StoreError> {
        let pk = cursor_pk(cursor);
        for _ in 0..MAX_CONFLICTS {
            let mut state = self.read_cursor(&pk).await?;
            let (answer, changed) = step(&mut state);
            if !changed || self.write_cursor(&pk, &state, now_ms).await? {
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
        self.cursor_step(&claim.cursor, now_ms, |c| c.acquire(claim, now_ms))
            .await
    }

    pub(super) async fn release_order(
        &self,
        cursor: &str,
        key: &str,
        delivered: Option<&OrderPosition>,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        let pk = cursor_pk(cursor);
        for _ in 0..MAX_CONFLICTS {
            let mut state = self.read_cursor(&pk).await?;
            if state.version == 0 {
                // No cursor: nothing to release, nobody to hand on to.
                return Ok(None);
            }
            let (changed, next) = state.release(key, delivered);
            if !changed || self.write_cursor(&pk, &state, now_ms).await? {
                return Ok(next);
            }
        }
        Err(StoreError::Unavailable(format!(
            "order cursor {cursor}: {MAX_CONFLICTS} conflicting writers in a row"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, at: i64) -> OrderClaim {
        OrderClaim {
            cursor: "shop#shopify#t1#1001".into(),
            key: key.into(),
            item: InboxKey::from_stored(format!("shopify#t1#evt_{key}")),
            position: OrderPosition {
                at,
                event_id: format!("evt_{key}"),
            },
            window_ms: 2_000,
            stale_before_ms: 0,
        }
    }

    #[test]
    fn a_shuffled_burst_goes_out_in_order_one_at_a_time() {
        let mut c = Cursor::default();
        // v3 first: it opens the window, so nothing goes before the window ends.
        assert_eq!(
            c.acquire(&claim("k3", 3), 100),
            (OrderGate::Wait { until_ms: 2_100 }, true)
        );
        assert!(matches!(
            c.acquire(&claim("k1", 1), 200).0,
            OrderGate::Wait { .. }
        ));
        assert!(matches!(
            c.acquire(&claim("k2", 2), 300).0,
            OrderGate::Wait { .. }
        ));
        // After the window: only the oldest goes, then holds the object.
        assert!(matches!(
            c.acquire(&claim("k3", 3), 2_200).0,
            OrderGate::Wait { .. }
        ));
        assert_eq!(c.acquire(&claim("k1", 1), 2_200), (OrderGate::Go, true));
        // Asking again: the same answer, nothing to write.
        assert_eq!(c.acquire(&claim("k1", 1), 2_300), (OrderGate::Go, false));
        assert!(matches!(
            c.acquire(&claim("k2", 2), 2_300).0,
            OrderGate::Wait { .. }
        ));
        let (changed, next) = c.release("k1", Some(&claim("k1", 1).position));
        assert!(changed);
        assert_eq!(
            next.as_ref().map(InboxKey::as_str),
            Some("shopify#t1#evt_k2")
        );
        assert_eq!(c.acquire(&claim("k2", 2), 2_400).0, OrderGate::Go);
        c.release("k2", Some(&claim("k2", 2).position));
        assert_eq!(c.acquire(&claim("k3", 3), 2_500).0, OrderGate::Go);
        let (_, next) = c.release("k3", Some(&claim("k3", 3).position));
        assert_eq!(next, None);
        // A straggler older than what was delivered is superseded, never queued.
        let (gate, changed) = c.acquire(&claim("k0", 0), 3_000);
        assert_eq!(
            gate,
            OrderGate::Superseded {
                delivered: claim("k3", 3).position
            }
        );
        assert!(!changed && c.queue.is_empty());
    }

    #[test]
    fn a_failed_delivery_releases_without_raising_the_position() {
        let mut c = Cursor::default();
        let mut first = claim("k1", 1);
        first.window_ms = 0;
        assert_eq!(c.acquire(&first, 10).0, OrderGate::Go);
        let (_, next) = c.release("k1", None);
        assert_eq!(next, None);
        assert_eq!(c.delivered, None);
        // The position only rises.
        c.release("x", Some(&claim("k5", 5).position));
        c.release("y", Some(&claim("k4", 4).position));
        assert_eq!(c.delivered, Some(claim("k5", 5).position));
    }

    #[test]
    fn stale_entries_are_dropped_and_a_full_queue_waits_outside() {
        let mut c = Cursor::default();
        let mut old = claim("k1", 1);
        old.window_ms = 0;
        assert_eq!(c.acquire(&old, 10).0, OrderGate::Go);
        // k1 holds the object and then vanishes; past its staleness k2 takes over.
        let mut next = claim("k2", 2);
        next.window_ms = 0;
        assert!(matches!(c.acquire(&next, 20).0, OrderGate::Wait { .. }));
        next.stale_before_ms = 15;
        assert_eq!(c.acquire(&next, 30).0, OrderGate::Go);
        assert!(!c.queue.contains_key("k1"));

        let mut full = Cursor::default();
        for i in 0..MAX_ORDER_QUEUE {
            full.acquire(&claim(&format!("q{i}"), 10 + i as i64), 1);
        }
        let (gate, changed) = full.acquire(&claim("late", 99), 2);
        assert!(matches!(gate, OrderGate::Wait { .. }) && !changed);
        assert_eq!(full.queue.len(), MAX_ORDER_QUEUE);
    }
}
