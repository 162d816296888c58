//! Parked items on DynamoDB: Queries on the sparse `by_wait_shard` GSI (hash
//! `wait_shard` = shard of the prerequisite's pk, range `wait_on` = that pk,
//! projecting `state`, `updated_at_ms`, `waiting_since_ms`). Never a Scan, never a
//! read of the items themselves.
//!
//! Only parked items are in the index (and a woken waiter until its attempt ends), so
//! an event that never waits writes nothing to it; a parked one costs one index write
//! to enter, one per claim of a wake, one delete to leave. The GSI is eventually
//! consistent: a wake that misses a waiter parked a moment ago is covered by the
//! processor's re-check after parking and by the sweeper's periodic re-send, which
//! pages through the index over its passes (a cursor item, `sweep#waiting-cursor`).

use aws_sdk_dynamodb::types::AttributeValue;

use super::error::describe;
use super::item::{self, n_attr, s_attr};
use super::query::{pk_of, query_up_to};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{InboxState, StoreError, WaitingScan};

/// A shard number and the index key a waiting pass goes on after.
type WaitingCursor = (usize, Option<item::Item>);

/// The cursor item's attributes (its own names, so no index picks it up).
const CURSOR_SHARD: &str = "shard";
const CURSOR_PK: &str = "after_pk";
const CURSOR_ON: &str = "after_wait_on";
const CURSOR_WAIT_SHARD: &str = "after_wait_shard";

/// The index key of a waiters' index entry (its table key and index keys), to start
/// a Query after it.
fn entry_key(m: &item::Item) -> item::Item {
    [item::PK, item::WAIT_ON, item::WAIT_SHARD]
        .into_iter()
        .filter_map(|name| m.get(name).map(|v| (name.to_string(), v.clone())))
        .collect()
}

fn number(m: &item::Item, attr: &str) -> Option<i64> {
    match m.get(attr) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    }
}

impl AwsStore {
    /// Up to `limit` keys of the items parked on `record_pk`: one Query (paged).
    pub(super) async fn waiters_of(
        &self,
        record_pk: &str,
        limit: usize,
    ) -> Result<Vec<InboxKey>, StoreError> {
        let query = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(item::BY_WAIT_SHARD)
            .key_condition_expression("#shard = :shard AND #on = :on")
            .filter_expression("#state = :waiting")
            .expression_attribute_names("#shard", item::WAIT_SHARD)
            .expression_attribute_names("#on", item::WAIT_ON)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_values(":shard", s_attr(&item::sweep_shard(record_pk)))
            .expression_attribute_values(":on", s_attr(record_pk))
            .expression_attribute_values(":waiting", s_attr(InboxState::Waiting.as_str()));
        query_up_to(query, limit)
            .await?
            .iter()
            .map(|m| Ok(InboxKey::from_stored(pk_of(m, item::BY_WAIT_SHARD)?)))
            .collect()
    }

    /// One pass over the waiters' index, at most `read_max` entries, from where the
    /// last pass stopped (the cursor item [`item::WAITING_CURSOR`]): count and oldest
    /// wait of the parked entries read, and up to `limit` of them last touched before
    /// `due_before_ms`, in index order. The cursor moves past what was read (past the
    /// last due entry taken, when `limit` of them were taken first), shard after shard, and
    /// starts over once every shard was read, so every parked item comes up within a
    /// few passes however many there are.
    pub(super) async fn waiting_scan(
        &self,
        due_before_ms: i64,
        limit: usize,
        read_max: usize,
    ) -> Result<WaitingScan, StoreError> {
        let shards: Vec<String> = item::sweep_shards().collect();
        let (mut shard, mut start) = self.waiting_cursor().await?.unwrap_or((0, None));
        shard %= shards.len();
        let begun = (shard, start.clone());
        let mut scan = WaitingScan::default();
        let mut read = 0usize;
        let mut shards_done = 0usize;
        // Where the next pass goes on when `limit` due entries were taken before the
        // read bound: right after the last one (the rest is still read for the count).
        let mut taken_up_to: Option<WaitingCursor> = None;
        while read < read_max.max(1) && shards_done < shards.len() {
            let page = (read_max.max(1) - read).min(1_000) as i32;
            let out = self
                .dynamodb
                .query()
                .table_name(&self.table)
                .index_name(item::BY_WAIT_SHARD)
                .key_condition_expression("#shard = :shard")
                .expression_attribute_names("#shard", item::WAIT_SHARD)
                .expression_attribute_values(":shard", s_attr(&shards[shard]))
                .limit(page)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
            let entries = out.items.unwrap_or_default();
            let mut last = None;
            for m in entries {
                read += 1;
                let state = match m.get(item::STATE) {
                    Some(AttributeValue::S(state)) => InboxState::parse(state),
                    _ => None,
                };
                let updated = number(&m, item::UPDATED_AT_MS).unwrap_or(i64::MIN);
                let key = entry_key(&m);
                match state {
                    Some(InboxState::Waiting) => {
                        scan.count += 1;
                        if let Some(since) = number(&m, item::WAITING_SINCE_MS) {
                            scan.oldest_since_ms =
                                Some(scan.oldest_since_ms.map_or(since, |o| o.min(since)));
                        }
                    }
                    // A woken waiter whose worker died (not in the sweeper's other
                    // index): re-sent like a parked one once untouched that long.
                    Some(InboxState::Processing) => {}
                    _ => {
                        last = Some(key);
                        continue;
                    }
                }
                if updated < due_before_ms && scan.due.len() < limit {
                    scan.due
                        .push(InboxKey::from_stored(pk_of(&m, item::BY_WAIT_SHARD)?));
                    if scan.due.len() >= limit {
                        taken_up_to = Some((shard, Some(key.clone())));
                    }
                }
                last = Some(key);
            }
            match out.last_evaluated_key {
                // More in this shard: the next page (or pass) starts after the last.
                Some(lek) => start = Some(last.unwrap_or(lek)),
                None => {
                    shard = (shard + 1) % shards.len();
                    start = None;
                    shards_done += 1;
                }
            }
        }
        let cursor = taken_up_to.unwrap_or((shard, start));
        // A count-only read (`limit` 0: the metrics) leaves the sweeper's place alone.
        if limit > 0 && cursor != begun {
            self.save_waiting_cursor(&cursor).await?;
        }
        Ok(scan)
    }

    /// Where the last waiting pass stopped: a shard number and the index key to go on
    /// after (none: the shard's start). One strongly consistent read.
    async fn waiting_cursor(&self) -> Result<Option<WaitingCursor>, StoreError> {
        let out = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key(item::PK, s_attr(item::WAITING_CURSOR))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| {
                StoreError::Unavailable(describe("DynamoDB GetItem (waiting cursor)", &e))
            })?;
        let Some(m) = out.item else {
            return Ok(None);
        };
        let shard = number(&m, CURSOR_SHARD)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let after = match (m.get(CURSOR_PK), m.get(CURSOR_ON), m.get(CURSOR_WAIT_SHARD)) {
            (Some(pk), Some(on), Some(wait_shard)) => Some(item::Item::from([
                (item::PK.to_string(), pk.clone()),
                (item::WAIT_ON.to_string(), on.clone()),
                (item::WAIT_SHARD.to_string(), wait_shard.clone()),
            ])),
            _ => None,
        };
        Ok(Some((shard, after)))
    }

    /// Store the cursor (one unconditional put: a pass that raced another only
    /// re-sends a few items twice).
    async fn save_waiting_cursor(&self, cursor: &WaitingCursor) -> Result<(), StoreError> {
        let (shard, after) = cursor;
        let mut m = item::Item::from([
            (item::PK.to_string(), s_attr(item::WAITING_CURSOR)),
            (CURSOR_SHARD.to_string(), n_attr(*shard as i64)),
        ]);
        if let Some(after) = after {
            for (attr, name) in [
                (CURSOR_PK, item::PK),
                (CURSOR_ON, item::WAIT_ON),
                (CURSOR_WAIT_SHARD, item::WAIT_SHARD),
            ] {
                if let Some(v) = after.get(name) {
                    m.insert(attr.to_string(), v.clone());
                }
            }
        }
        self.dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(m))
            .send()
            .await
            .map_err(|e| {
                StoreError::Unavailable(describe("DynamoDB PutItem (waiting cursor)", &e))
            })?;
        Ok(())
    }
}
