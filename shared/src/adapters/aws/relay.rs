//! [`InboxRelay`] on DynamoDB: the relay's retries of failed deliveries, on the inbox
//! item itself (no table, no transaction of its own).
//!
//! - The processor's finish write records the deliveries (`deliveries`, a bounded list
//!   of maps) and, when one is pending, `relay_due_ms` + `relay_shard`: the item enters
//!   the sparse `by_relay_due` GSI (hash `relay_shard` = [`item::sweep_shard`] of the
//!   pk, range `relay_due_ms`, KEYS_ONLY). A happy path (every destination answered at
//!   once) writes neither attribute, so it costs no index write and no extra call.
//! - [`InboxRelay::relay_due`]: one Query per shard (`relay_due_ms <= now`, oldest
//!   first, paged), merged; never a Scan.
//! - [`InboxRelay::claim_relay`]: one conditional UpdateItem that takes the relay lease
//!   (`relay_lease_until_ms`, `relay_owner`) of a finished item with something pending,
//!   and returns the item (`ReturnValues=ALL_NEW`; its body from the body item). The index keys are
//!   untouched, so a claim writes no index entry, and a relay that dies holding the
//!   lease leaves the item due: the next run claims it once the lease has run out.
//! - [`InboxRelay::finish_relay`]: one conditional UpdateItem (only the lease holder)
//!   that writes the outcomes, moves `relay_due_ms` to the next attempt (or removes it
//!   with the shard: the item leaves the index) and releases the lease.
//! - Dead-lettered deliveries: the same writes keep `relay_dead_ms` +
//!   `relay_dead_shard` ([`crate::ports::dead_lettered_at`]) while one is dead-lettered,
//!   so the item is in the sparse `by_relay_dead` GSI (same shards and projection as
//!   `by_relay_due`); [`InboxRelay::relay_dead`] reads it, one Query per shard.
//! - Per-object ordering: a small cursor item per destination and object in the same
//!   table (pk `cursor#…`, see `cursor.rs`), updated conditionally.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};

use super::error;
use super::item::{self, n_attr, s_attr};
use super::query::{pk_of, query_up_to};
use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{
    dead_lettered_at, DeliveryStatus, InboxItem, InboxRelay, InboxState, OrderClaim, OrderGate,
    OrderRelease, StoreError,
};

impl AwsStore {
    /// Up to `limit` keys of one shard's items due at `now_ms`, earliest first, with
    /// their due time.
    async fn due_in_shard(
        &self,
        shard: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let query = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(item::BY_RELAY_DUE)
            .key_condition_expression("#shard = :shard AND #due <= :now")
            .expression_attribute_names("#shard", item::RELAY_SHARD)
            .expression_attribute_names("#due", item::RELAY_DUE_MS)
            .expression_attribute_values(":shard", s_attr(shard))
            .expression_attribute_values(":now", n_attr(now_ms))
            .scan_index_forward(true);
        query_up_to(query, limit)
            .await?
            .iter()
            .map(|m| {
                let due = match m.get(item::RELAY_DUE_MS) {
                    Some(AttributeValue::N(n)) => n.parse().unwrap_or(i64::MAX),
                    _ => i64::MAX,
                };
                Ok((due, pk_of(m, item::BY_RELAY_DUE)?))
            })
            .collect()
    }
}

impl AwsStore {
    /// Up to `limit` entries of each shard of the relay index `index` (hash `shard_attr`),
    /// in range-key order (`forward`), decoded from the projection alone: no item is
    /// read from the table.
    async fn projected_items(
        &self,
        index: &str,
        shard_attr: &str,
        forward: bool,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let mut items = Vec::new();
        if limit == 0 {
            return Ok(items);
        }
        for shard in item::sweep_shards() {
            let query = self
                .dynamodb
                .query()
                .table_name(&self.table)
                .index_name(index)
                .key_condition_expression("#shard = :shard")
                .expression_attribute_names("#shard", shard_attr)
                .expression_attribute_values(":shard", s_attr(&shard))
                .scan_index_forward(forward);
            for m in query_up_to(query, limit).await? {
                items.push(item::decode_projected(m).map_err(StoreError::Corrupt)?);
            }
        }
        Ok(items)
    }
}

#[async_trait]
impl InboxRelay for AwsStore {
    async fn relay_due(&self, now_ms: i64, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Each shard's earliest `limit`, merged: the earliest `limit` of all.
        let mut due = Vec::new();
        for shard in item::sweep_shards() {
            due.extend(self.due_in_shard(&shard, now_ms, limit).await?);
        }
        due.sort();
        due.truncate(limit);
        Ok(due
            .into_iter()
            .map(|(_, pk)| InboxKey::from_stored(pk))
            .collect())
    }

    async fn relay_pending(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        let mut pending = self
            .projected_items(item::BY_RELAY_DUE, item::RELAY_SHARD, true, limit)
            .await?;
        pending.sort_by(|a, b| {
            a.relay_due_ms
                .cmp(&b.relay_due_ms)
                .then_with(|| a.key.cmp(&b.key))
        });
        pending.truncate(limit);
        Ok(pending)
    }

    async fn relay_dead(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        let mut dead = self
            .projected_items(item::BY_RELAY_DEAD, item::RELAY_DEAD_SHARD, false, limit)
            .await?;
        // The index key, recomputed from what it projects (the same value the writes
        // stored; `updated_at_ms` stands in for a delivery never attempted).
        let at = |i: &InboxItem| dead_lettered_at(&i.deliveries, i.updated_at_ms);
        dead.sort_by(|a, b| at(b).cmp(&at(a)).then_with(|| a.key.cmp(&b.key)));
        dead.truncate(limit);
        Ok(dead)
    }

    async fn claim_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<InboxItem>, StoreError> {
        // Finished (`completed` / `ignored`) and no live relay lease: the processor owns
        // an item until its finish, the relay after it. Not necessarily due: a replay
        // re-schedules dead-lettered deliveries through this claim.
        let result = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression("SET #lease_until = :until, #owner = :owner")
            .condition_expression(
                "#state IN (:completed, :ignored) \
                 AND (attribute_not_exists(#lease_until) OR #lease_until < :now)",
            )
            .expression_attribute_names("#lease_until", item::RELAY_LEASE_UNTIL_MS)
            .expression_attribute_names("#owner", item::RELAY_OWNER)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_values(":until", n_attr(now_ms.saturating_add(lease_ms)))
            .expression_attribute_values(":owner", s_attr(owner))
            .expression_attribute_values(":now", n_attr(now_ms))
            .expression_attribute_values(":completed", s_attr(InboxState::Completed.as_str()))
            .expression_attribute_values(":ignored", s_attr(InboxState::Ignored.as_str()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(out) => {
                let mut claimed = item::decode_returned(out.attributes, "relay claim", key)?;
                // The body is in its own item (`item.rs`); the original bytes are
                // what a destination with `body = "original"` receives.
                self.load_body(&mut claimed).await?;
                Ok(Some(claimed))
            }
            // Delivered meanwhile, leased by another relay, or gone (TTL).
            Err(e) => error::refused(e).map(|_| None),
        }
    }

    async fn finish_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        deliveries: &[DeliveryStatus],
        relay_due_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .condition_expression("#owner = :owner")
            .expression_attribute_names("#owner", item::RELAY_OWNER)
            .expression_attribute_names("#lease_until", item::RELAY_LEASE_UNTIL_MS)
            .expression_attribute_names("#deliveries", item::DELIVERIES)
            .expression_attribute_names("#due", item::RELAY_DUE_MS)
            .expression_attribute_names("#shard", item::RELAY_SHARD)
            .expression_attribute_names("#dead", item::RELAY_DEAD_MS)
            .expression_attribute_names("#dead_shard", item::RELAY_DEAD_SHARD)
            .expression_attribute_values(":owner", s_attr(owner))
            .expression_attribute_values(":deliveries", item::deliveries_attr(deliveries));
        let shard = s_attr(&item::sweep_shard(key.as_str()));
        let mut set = vec!["#deliveries = :deliveries"];
        let mut remove = vec!["#owner", "#lease_until"];
        match relay_due_ms {
            Some(due) => {
                request = request
                    .expression_attribute_values(":due", n_attr(due))
                    .expression_attribute_values(":shard", shard.clone());
                set.push("#due = :due, #shard = :shard");
            }
            None => remove.push("#due, #shard"),
        }
        match dead_lettered_at(deliveries, now_ms) {
            Some(dead) => {
                request = request
                    .expression_attribute_values(":dead", n_attr(dead))
                    .expression_attribute_values(":dead_shard", shard);
                set.push("#dead = :dead, #dead_shard = :dead_shard");
            }
            None => remove.push("#dead, #dead_shard"),
        }
        let expression = format!("SET {} REMOVE {}", set.join(", "), remove.join(", "));
        let result = request.update_expression(expression).send().await;
        match result {
            Ok(_) => Ok(true),
            // Our lease ran out and another relay took the item: its write wins.
            Err(e) => error::refused(e).map(|_| false),
        }
    }

    async fn order_acquire(
        &self,
        claim: &OrderClaim,
        now_ms: i64,
    ) -> Result<OrderGate, StoreError> {
        self.acquire_order(claim, now_ms).await
    }

    async fn order_release(
        &self,
        release: &OrderRelease,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        self.release_order(release, now_ms).await
    }
}
