//! Parked items on DynamoDB: Queries on the sparse `by_wait_shard` GSI (hash
//! `wait_shard` = shard of the prerequisite's pk, range `wait_on` = that pk,
//! projecting `state`, `updated_at_ms`, `waiting_since_ms`). Never a Scan, never a
//! read of the items themselves.
//!
//! Only parked items are in the index (and a woken waiter until its attempt ends), so
//! an event that never waits writes nothing to it; a parked one costs one index write
//! to enter, one per claim of a wake, one delete to leave. The GSI is eventually
//! consistent: a wake that misses a waiter parked a moment ago is covered by the
//! processor's re-check after parking and by the sweeper's periodic re-send.

use aws_sdk_dynamodb::types::AttributeValue;

use super::item::{self, s_attr};
use super::query::{pk_of, query_up_to};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{InboxState, StoreError, WaitingScan, WAITING_SCAN_MAX};

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

    /// Every shard's entries, up to [`WAITING_SCAN_MAX`] in all: count and oldest wait
    /// of the parked ones, and the `limit` least recently touched before
    /// `due_before_ms`.
    pub(super) async fn waiting_scan(
        &self,
        due_before_ms: i64,
        limit: usize,
    ) -> Result<WaitingScan, StoreError> {
        let mut scan = WaitingScan::default();
        let mut due: Vec<(i64, String)> = Vec::new();
        let mut read = 0usize;
        for shard in item::sweep_shards() {
            if read >= WAITING_SCAN_MAX {
                break;
            }
            let query = self
                .dynamodb
                .query()
                .table_name(&self.table)
                .index_name(item::BY_WAIT_SHARD)
                .key_condition_expression("#shard = :shard")
                .expression_attribute_names("#shard", item::WAIT_SHARD)
                .expression_attribute_values(":shard", s_attr(&shard));
            for m in query_up_to(query, WAITING_SCAN_MAX - read).await? {
                read += 1;
                let state = match m.get(item::STATE) {
                    Some(AttributeValue::S(state)) => InboxState::parse(state),
                    _ => None,
                };
                let updated = number(&m, item::UPDATED_AT_MS).unwrap_or(i64::MIN);
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
                    _ => continue,
                }
                if updated < due_before_ms {
                    due.push((updated, pk_of(&m, item::BY_WAIT_SHARD)?));
                }
            }
        }
        due.sort();
        due.truncate(limit);
        scan.due = due
            .into_iter()
            .map(|(_, pk)| InboxKey::from_stored(pk))
            .collect();
        Ok(scan)
    }
}
