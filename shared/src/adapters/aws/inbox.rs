//! [`Inbox`] and [`InboxProcessing`] on DynamoDB: the receiver's conditional put and
//! the processor's claim/finish, each one call with the allowed transitions in the
//! condition expression.
//!
//! The body is in an item of its own (`item::body_key`), put once right after the
//! event's item is inserted; the event's item stays small, so its put, a duplicate's
//! rejected put and the finish cost one write unit each.
//!
//! Processing starts without a claim ([`InboxProcessing::begin`]): the SQS message
//! carries the item and its body (`queue.rs`), so the processor's calls on the common
//! path are the state load, the commit and the finish. No lease is needed: SQS hides
//! the message while the run is in flight (a crashed run reappears after the
//! visibility timeout), `ApproximateReceiveCount` counts the attempts, and business
//! commits are guarded by versions and effect keys, so a concurrent duplicate run
//! commits nothing twice. Such a run finishes with
//! [`Handout::Unleased`] finish: any item not yet terminal (and not held by a
//! live lease of a worker that did claim it: `claim` still exists, and a previous
//! release's processor uses it during an update), so a terminal state is never
//! overwritten; it records the attempt count (from SQS's receive count, or the
//! stored count + 1 for a pointer).

use async_trait::async_trait;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::operation::update_item::{UpdateItemError, UpdateItemOutput};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::error::{self, describe};
use super::item::{self, n_attr, s_attr};
use super::{AwsStore, DEFAULT_LIST_LIMIT};
use crate::envelope::InboxKey;
use crate::ports::{
    may_lack_body, ClaimOutcome, Delivery, Finish, Handout, Inbox, InboxFilter, InboxItem,
    InboxProcessing, InboxState, ItemVersion, PutOutcome, StoreError, WaitChange, BODY_MISSING,
};
use crate::ports::{InboxPage, InboxQuery, SearchError, StateCounts};

impl AwsStore {
    /// The existing item of a failed conditional put; our own insert when it carries
    /// this call's `put_id`.
    async fn duplicate(
        &self,
        old: Option<item::Item>,
        key: &InboxKey,
        put_id: &str,
    ) -> Result<PutOutcome, StoreError> {
        let old = match old {
            Some(old) => old,
            // A compatible server that ignores ALL_OLD: one extra read.
            None => self.get_raw(key).await?.ok_or_else(|| {
                // Expired or deleted in between; the provider retries and it inserts.
                StoreError::Unavailable(format!(
                    "DynamoDB PutItem: item {key} vanished after a failed condition"
                ))
            })?,
        };
        if item::put_id(&old) == Some(put_id) {
            // The SDK retried our PutItem after a lost response (a 500 "may have
            // succeeded", a timeout): the first attempt stored the item, so this request
            // inserted it and must send its pointer, not answer as a duplicate.
            tracing::info!(pk = %key, "PutItem retried after a lost response: our own insert");
            return Ok(PutOutcome::Inserted);
        }
        item::decode(old)
            .map(|old| PutOutcome::Duplicate(Box::new(old)))
            .map_err(StoreError::Corrupt)
    }

    /// Put `item`'s body item (unconditional: the same bytes on every retry).
    async fn put_body(&self, item: &InboxItem) -> Result<(), StoreError> {
        self.dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item::encode_body(item)))
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB PutItem (body)", &e)))?;
        Ok(())
    }

    /// A duplicate of an item not yet `completed` / `ignored`: its first request may
    /// have died or failed between the event's put and the body's (it was never
    /// acknowledged, so the provider retries). Put the body unless it is there: one
    /// write, on a rare path (a duplicate of a finished event, the common one, writes
    /// nothing more). `true` when this call stored it.
    async fn put_body_if_missing(&self, item: &InboxItem) -> Result<bool, StoreError> {
        let result = self
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item::encode_body(item)))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", item::PK)
            .send()
            .await;
        match result {
            Ok(_) => {
                tracing::warn!(pk = %item.key, "body item was missing; stored from a duplicate");
                Ok(true)
            }
            Err(e) => error::refused(e).map(|_| false),
        }
    }

    /// A duplicate of `old` (stored without its body item): store the body if it is
    /// missing and take the item back ([`PutOutcome::Restored`]): a `dead_letter` one
    /// returns to `queued`. A `dead_letter` whose reason says the body was missing is
    /// taken back even when the body is there now (a restore that stored the body and
    /// died before moving the item).
    async fn restore_body(
        &self,
        item: &InboxItem,
        old: InboxItem,
    ) -> Result<PutOutcome, StoreError> {
        let stored = self.put_body_if_missing(item).await?;
        let dead_without_body = old.state == InboxState::DeadLetter
            && old
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with(BODY_MISSING));
        if !stored && !dead_without_body {
            return Ok(PutOutcome::Duplicate(Box::new(old)));
        }
        if old.state != InboxState::DeadLetter {
            return Ok(PutOutcome::Restored(Box::new(old)));
        }
        let now_ms = item.updated_at_ms;
        let result = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(&old.key))
            .update_expression(
                "SET #state = :queued, #updated = :now, #shard = :shard REMOVE #dead_over",
            )
            .condition_expression("#state = :dead")
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#shard", item::SWEEP_SHARD)
            .expression_attribute_names("#dead_over", item::DEAD_OVER)
            .expression_attribute_values(":queued", s_attr(InboxState::Queued.as_str()))
            .expression_attribute_values(":dead", s_attr(InboxState::DeadLetter.as_str()))
            .expression_attribute_values(":now", n_attr(now_ms))
            .expression_attribute_values(":shard", s_attr(&item::sweep_shard(old.key.as_str())))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(out) => {
                tracing::warn!(pk = %old.key, "dead letter without its body taken back: body stored, queued again");
                let now = item::decode_returned(out.attributes, "restore", &old.key)?;
                Ok(PutOutcome::Restored(Box::new(now)))
            }
            // Moved meanwhile (a replay queued it): the body is stored either way.
            Err(e) => error::refused(e).map(|_| PutOutcome::Restored(Box::new(old))),
        }
    }

    /// The compressed body of `key` from its body item; `None` when there is none
    /// (TTL-deleted, or its receiver died between the two puts).
    async fn get_body(&self, key: &InboxKey) -> Result<Option<Vec<u8>>, StoreError> {
        let out = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key(item::PK, item::s_attr(&item::body_key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem (body)", &e)))?;
        out.item
            .map(|m| item::decode_body(m).map_err(StoreError::Corrupt))
            .transpose()
    }

    /// Fill in the body of an item whose body is in its own item (an item of the
    /// earlier layout has it inline). `Ok(false)` when the body item is missing.
    pub(crate) async fn load_body(&self, item: &mut InboxItem) -> Result<bool, StoreError> {
        if !item.body.is_empty() {
            return Ok(true);
        }
        match self.get_body(&item.key).await? {
            Some(body) => {
                item.body = body;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// An item about to be processed needs its body: a missing one is
    /// [`ClaimOutcome::BodyMissing`] (its receiver died or failed between the two
    /// puts; the provider's retry stores it).
    async fn with_body(&self, mut item: InboxItem) -> Result<ClaimOutcome, StoreError> {
        if self.load_body(&mut item).await? {
            Ok(ClaimOutcome::Claimed(Box::new(item)))
        } else {
            Ok(ClaimOutcome::BodyMissing(Box::new(item)))
        }
    }

    /// The stored attributes of `key` (consistent read).
    async fn get_raw(&self, key: &InboxKey) -> Result<Option<item::Item>, StoreError> {
        let out = self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB GetItem", &e)))?;
        Ok(out.item)
    }

    /// Why a claim's condition failed, from the ALL_OLD item.
    async fn claim_refused(
        &self,
        old: Option<item::Item>,
        key: &InboxKey,
        now_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let old = match old {
            Some(old) => Some(item::decode(old).map_err(StoreError::Corrupt)?),
            // A compatible server that ignores ALL_OLD (or no item at all): one read.
            None => self.get(key).await?,
        };
        Ok(match old {
            None => ClaimOutcome::Missing,
            Some(old) if old.state.is_terminal() => ClaimOutcome::Finished(old.state),
            Some(old) => match (old.state, old.lease_until_ms) {
                (InboxState::Processing, Some(until_ms)) if until_ms > now_ms => {
                    ClaimOutcome::Leased { until_ms }
                }
                // Claimable after all: only a read that raced a concurrent change
                // (the fallback path) gets here. The caller retries later.
                _ => {
                    return Err(StoreError::Unavailable(format!(
                        "DynamoDB UpdateItem: claim of {key} refused in state {}",
                        old.state
                    )))
                }
            },
        })
    }
}

#[async_trait]
impl Inbox for AwsStore {
    async fn put_new(&self, item: &InboxItem) -> Result<PutOutcome, StoreError> {
        // One id per call, the same on every SDK retry of this PutItem: a retry whose
        // condition fails on an item with this id finds our own first attempt.
        let put_id = item::new_put_id();
        let mut attributes = item::encode(item);
        attributes.insert(item::PUT_ID.into(), AttributeValue::S(put_id.clone()));
        let result = self
            .dynamodb
            .put_item()
            .table_name(&self.table)
            .set_item(Some(attributes))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", item::PK)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let outcome = match result {
            Ok(_) => PutOutcome::Inserted,
            Err(e) => {
                let old = error::refused(e)?;
                self.duplicate(old, &item.key, &put_id).await?
            }
        };
        match outcome {
            PutOutcome::Inserted => {
                if let Err(e) = self.put_body(item).await {
                    // Not acknowledged: the provider retries, and that duplicate stores
                    // the body and re-enqueues at once (not after the grace period).
                    if let Err(mark) = self.mark_enqueue_failed(&item.key).await {
                        tracing::warn!(pk = %item.key, error = %mark, "could not record the failed body put");
                    }
                    return Err(e);
                }
                Ok(PutOutcome::Inserted)
            }
            // The body is in an item of its own and may never have been written.
            PutOutcome::Duplicate(old) if old.body.is_empty() && may_lack_body(old.state) => {
                self.restore_body(item, *old).await
            }
            other => Ok(other),
        }
    }

    /// The event's item with its body (a second read when the body is in its own
    /// item; empty when that item is missing).
    async fn get(&self, key: &InboxKey) -> Result<Option<InboxItem>, StoreError> {
        let Some(m) = self.get_raw(key).await? else {
            return Ok(None);
        };
        let mut item = item::decode(m).map_err(StoreError::Corrupt)?;
        self.load_body(&mut item).await?;
        Ok(Some(item))
    }

    /// A Scan with a filter: an operator tool, not a hot path. It reads the whole
    /// table to return the true newest items (a GSI on state + received_at_ms would
    /// make this a Query once listings matter for cost).
    async fn list(&self, filter: &InboxFilter) -> Result<Vec<InboxItem>, StoreError> {
        let limit = if filter.limit == 0 {
            DEFAULT_LIST_LIMIT
        } else {
            filter.limit
        };
        let mut conditions = Vec::new();
        let mut request = self.dynamodb.scan().table_name(&self.table);
        if let Some(state) = filter.state {
            conditions.push("#state = :state");
            request = request
                .expression_attribute_names("#state", item::STATE)
                .expression_attribute_values(":state", AttributeValue::S(state.as_str().into()));
        }
        if let Some(provider) = &filter.provider {
            conditions.push("#provider = :provider");
            request = request
                .expression_attribute_names("#provider", item::PROVIDER)
                .expression_attribute_values(":provider", AttributeValue::S(provider.clone()));
        }
        if let Some(tenant) = &filter.tenant {
            conditions.push("#tenant = :tenant");
            request = request
                .expression_attribute_names("#tenant", item::TENANT)
                .expression_attribute_values(":tenant", AttributeValue::S(tenant.clone()));
        }
        if !conditions.is_empty() {
            request = request.filter_expression(conditions.join(" AND "));
        }

        let mut found: Vec<InboxItem> = Vec::new();
        let mut start = None;
        loop {
            let out = request
                .clone()
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB Scan", &e)))?;
            // The relay's ordering cursors share the table; they are no events.
            for m in out
                .items
                .unwrap_or_default()
                .into_iter()
                .filter(item::is_event)
            {
                found.push(item::decode(m).map_err(StoreError::Corrupt)?);
            }
            // Keep memory bounded by the limit, not by the table.
            if found.len() > limit.saturating_mul(2) {
                newest_first(&mut found, limit);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        newest_first(&mut found, limit);
        Ok(found)
    }

    /// A bounded Scan (see `search.rs` for the bound and why no index).
    async fn search(&self, query: &InboxQuery) -> Result<InboxPage, SearchError> {
        self.search_scan(query).await
    }

    async fn count_states(&self, filter: &InboxFilter) -> Result<StateCounts, StoreError> {
        self.count_states_scan(filter).await
    }

    async fn mark_enqueue_failed(&self, key: &InboxKey) -> Result<(), StoreError> {
        let result = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression("SET #ef = :true")
            .condition_expression("#state = :received")
            .expression_attribute_names("#ef", item::ENQUEUE_FAILED)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .expression_attribute_values(
                ":received",
                AttributeValue::S(crate::ports::InboxState::Received.as_str().into()),
            )
            .send()
            .await;
        // Missing or already past `received`: the processor owns it now.
        conditional_update(result).map(|_| ())
    }
}

/// The claim condition, shared with `mark_dead_letter`: the item exists and is
/// waiting (`received`, `queued`, `retryable`) or held by a lease that ran out.
const CLAIMABLE: &str =
    "attribute_exists(#pk) AND (#state IN (:received, :queued, :retryable, :waiting) \
     OR (#state = :processing AND (attribute_not_exists(#lease_until) OR #lease_until <= :now)))";

/// The claim condition with every name and value it reads (`:now` is the caller's: its
/// update sets it too): pending, or processing under an expired lease.
fn claimable(update: UpdateItemFluentBuilder) -> UpdateItemFluentBuilder {
    update
        .condition_expression(CLAIMABLE)
        .expression_attribute_names("#pk", item::PK)
        .expression_attribute_names("#state", item::STATE)
        .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
        .expression_attribute_values(":received", s_attr(InboxState::Received.as_str()))
        .expression_attribute_values(":queued", s_attr(InboxState::Queued.as_str()))
        .expression_attribute_values(":retryable", s_attr(InboxState::Retryable.as_str()))
        .expression_attribute_values(":waiting", s_attr(InboxState::Waiting.as_str()))
        .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
}

#[async_trait]
impl InboxProcessing for AwsStore {
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        // Leaves the sweeper's index alone: its key (shard, received_at_ms) is constant
        // while the item is pending, so a claim writes only the table.
        let result = claimable(self.dynamodb.update_item())
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression(
                "SET #state = :processing, #lease_owner = :owner, #lease_until = :until, \
                 #updated = :now, #attempts = if_not_exists(#attempts, :zero) + :one",
            )
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#attempts", item::ATTEMPTS)
            .expression_attribute_values(":owner", s_attr(owner))
            .expression_attribute_values(":until", n_attr(now_ms.saturating_add(lease_ms)))
            .expression_attribute_values(":now", n_attr(now_ms))
            .expression_attribute_values(":zero", n_attr(0))
            .expression_attribute_values(":one", n_attr(1))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let claimed = item::decode_returned(out.attributes, "claim", key)?;
                self.with_body(claimed).await
            }
            Err(e) => {
                let old = error::refused(e)?;
                self.claim_refused(old, key, now_ms).await
            }
        }
    }

    /// No write: the item the message carried, or (a pointer alone: a wake, the
    /// sweeper's or a replay's re-send, a message of the previous release) one
    /// consistent read of the item and, when it is to be processed, of its body.
    async fn begin(
        &self,
        delivery: &Delivery,
        _owner: &str,
        now_ms: i64,
        _lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        let key = &delivery.message.pk;
        // The snapshot is the item as sent. On a redelivery of the same message (a
        // crashed or panicked run) another run may have moved the item on since, and
        // the finish is conditioned on the item as read: read it.
        let first_receive = delivery.receive_count <= 1;
        if let Some(carried) = delivery
            .item
            .as_ref()
            .filter(|i| i.key == *key && first_receive)
        {
            let mut item = carried.clone();
            item.lease_owner = None;
            item.lease_until_ms = None;
            // The snapshot is from the send; SQS counts the receives since.
            item.attempts = item
                .attempts
                .saturating_add(1)
                .max(attempts_so_far(delivery));
            return Ok(ClaimOutcome::Claimed(item));
        }
        let Some(m) = self.get_raw(key).await? else {
            return Ok(ClaimOutcome::Missing);
        };
        let mut item = item::decode(m).map_err(StoreError::Corrupt)?;
        if item.state.is_terminal() {
            return Ok(ClaimOutcome::Finished(item.state));
        }
        if let (InboxState::Processing, Some(until_ms)) = (item.state, item.lease_until_ms) {
            if until_ms > now_ms {
                return Ok(ClaimOutcome::Leased { until_ms });
            }
        }
        item.attempts = item
            .attempts
            .saturating_add(1)
            .max(attempts_so_far(delivery));
        // Not leased by this run (a lease that ran out belongs to nobody).
        item.lease_owner = None;
        item.lease_until_ms = None;
        self.with_body(item).await
    }

    async fn finish(
        &self,
        key: &InboxKey,
        run: &Handout,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        self.finish_item(key, run, finish).await
    }

    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        seen: ItemVersion,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let result = claimable(self.dynamodb.update_item())
            // Only the item as read: a finish, park or replay since wins.
            .condition_expression(format!(
                "{CLAIMABLE} AND #state = :seen_state AND #updated = :seen_updated"
            ))
            .expression_attribute_values(":seen_state", s_attr(seen.state.as_str()))
            .expression_attribute_values(":seen_updated", n_attr(seen.updated_at_ms))
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression(
                "SET #state = :dead, #error = :reason, #updated = :now, \
                 #dead_over = :seen_updated \
                 REMOVE #lease_owner, #lease_until, #shard, #wait_on, #wait_shard, #wait_since",
            )
            .expression_attribute_names("#dead_over", item::DEAD_OVER)
            .expression_attribute_names("#shard", item::SWEEP_SHARD)
            .expression_attribute_names("#wait_on", item::WAIT_ON)
            .expression_attribute_names("#wait_shard", item::WAIT_SHARD)
            .expression_attribute_names("#wait_since", item::WAITING_SINCE_MS)
            .expression_attribute_names("#error", item::LAST_ERROR)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_values(":dead", s_attr(InboxState::DeadLetter.as_str()))
            .expression_attribute_values(":reason", s_attr(reason))
            .expression_attribute_values(":now", n_attr(now_ms))
            .send()
            .await;
        // Missing, changed since it was read, or a live worker will finish it.
        conditional_update(result)
    }

    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        self.waiters_of(record_pk, limit).await
    }
}

impl AwsStore {
    /// The finish write of a claimed run ([`Leased`]) or of one `begin` handed out
    /// without a lease ([`Unleased`]).
    async fn finish_item(
        &self,
        key: &InboxKey,
        run: &Handout,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        let mut set = vec!["#state = :state".to_string(), "#updated = :now".to_string()];
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
            .expression_attribute_values(":state", s_attr(finish.state.as_str()))
            .expression_attribute_values(":now", n_attr(finish.now_ms))
            .expression_attribute_names("#dead_over", item::DEAD_OVER);
        request = match run {
            Handout::Leased { owner } => request
                .condition_expression("#state = :processing AND #lease_owner = :owner")
                .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
                .expression_attribute_values(":owner", s_attr(owner)),
            Handout::Unleased { attempts, seen } => {
                set.push("#attempts = :attempts".into());
                // The item as this run read it (every state change stamps `updated`, a
                // claim included), or the sweeper's marking of exactly that version.
                request
                    .condition_expression(
                        "attribute_exists(#pk) AND ((#state = :seen_state AND #updated = :seen_updated) \
                         OR (#state = :dead AND #dead_over = :seen_updated))",
                    )
                    .expression_attribute_names("#pk", item::PK)
                    .expression_attribute_names("#attempts", item::ATTEMPTS)
                    .expression_attribute_values(":attempts", n_attr(i64::from(*attempts)))
                    .expression_attribute_values(":seen_state", s_attr(seen.state.as_str()))
                    .expression_attribute_values(":seen_updated", n_attr(seen.updated_at_ms))
                    .expression_attribute_values(":dead", s_attr(InboxState::DeadLetter.as_str()))
            }
        };
        let mut remove = "#lease_owner, #lease_until, #dead_over".to_string();
        // A completed / ignored event carries no error: an earlier failure's is removed.
        let clears_error = finish.clears_error();
        // Optional fields: set when given, left alone otherwise. The attribute names
        // are plain identifiers, so they serve as their own placeholders.
        for (attr, value) in [
            (item::LAST_ERROR_CLASS, &finish.error_class),
            (item::LAST_ERROR, &finish.error),
            (item::RESULT, &finish.result),
        ] {
            if clears_error && attr != item::RESULT {
                remove.push_str(&format!(", #{attr}"));
                request = request.expression_attribute_names(format!("#{attr}"), attr);
            } else if let Some(value) = value {
                set.push(format!("#{attr} = :{attr}"));
                request = request
                    .expression_attribute_names(format!("#{attr}"), attr)
                    .expression_attribute_values(format!(":{attr}"), s_attr(value));
            }
        }
        // The sweeper's sparse index: untouched while the item stays pending (a retry
        // writes no index entry), left once terminal (one index delete).
        match &finish.wait {
            // A run that started from the message's snapshot may not know the item
            // parked meanwhile (a duplicate message): leaving waiting for a terminal
            // state always drops the marker (free when it is absent).
            WaitChange::Keep if finish.state.is_terminal() => {
                remove.push_str(", #wait_on, #wait_shard, #wait_since");
                request = request
                    .expression_attribute_names("#wait_on", item::WAIT_ON)
                    .expression_attribute_names("#wait_shard", item::WAIT_SHARD)
                    .expression_attribute_names("#wait_since", item::WAITING_SINCE_MS);
            }
            WaitChange::Keep => {}
            // Parked: into the waiters' index (one entry), out of the sweeper's.
            WaitChange::Park(w) => {
                set.push(
                    "#wait_on = :wait_on, #wait_shard = :wait_shard, #wait_since = :wait_since"
                        .into(),
                );
                request = request
                    .expression_attribute_names("#wait_on", item::WAIT_ON)
                    .expression_attribute_names("#wait_shard", item::WAIT_SHARD)
                    .expression_attribute_names("#wait_since", item::WAITING_SINCE_MS)
                    .expression_attribute_values(":wait_on", s_attr(&w.on))
                    .expression_attribute_values(":wait_shard", s_attr(&item::sweep_shard(&w.on)))
                    .expression_attribute_values(":wait_since", n_attr(w.since_ms));
            }
            // Moving on from waiting: out of the waiters' index, and back into the
            // sweeper's while still pending (a retry after a wake).
            WaitChange::Clear => {
                remove.push_str(", #wait_on, #wait_shard, #wait_since");
                request = request
                    .expression_attribute_names("#wait_on", item::WAIT_ON)
                    .expression_attribute_names("#wait_shard", item::WAIT_SHARD)
                    .expression_attribute_names("#wait_since", item::WAITING_SINCE_MS);
                if item::in_sweep_index(finish.state) {
                    set.push("#shard = :shard".into());
                    request = request
                        .expression_attribute_names("#shard", item::SWEEP_SHARD)
                        .expression_attribute_values(
                            ":shard",
                            s_attr(&item::sweep_shard(key.as_str())),
                        );
                }
            }
        }
        if !item::in_sweep_index(finish.state) {
            remove.push_str(", #shard");
            request = request.expression_attribute_names("#shard", item::SWEEP_SHARD);
        }
        // The relay's record rides on this write: no write of its own on the happy
        // path, and the relay's index only when something is pending.
        if let Some(deliveries) = &finish.deliveries {
            request = request
                .expression_attribute_names("#deliveries", item::DELIVERIES)
                .expression_attribute_names("#relay_due", item::RELAY_DUE_MS)
                .expression_attribute_names("#relay_shard", item::RELAY_SHARD);
            if deliveries.is_empty() {
                remove.push_str(", #deliveries");
            } else {
                set.push("#deliveries = :deliveries".into());
                request = request
                    .expression_attribute_values(":deliveries", item::deliveries_attr(deliveries));
            }
            match finish.relay_due_ms {
                Some(due) => {
                    set.push("#relay_due = :relay_due, #relay_shard = :relay_shard".into());
                    request = request
                        .expression_attribute_values(":relay_due", n_attr(due))
                        .expression_attribute_values(
                            ":relay_shard",
                            s_attr(&item::sweep_shard(key.as_str())),
                        );
                }
                None => remove.push_str(", #relay_due, #relay_shard"),
            }
            // Dead-lettered deliveries: into (or out of) their own index.
            request = request
                .expression_attribute_names("#relay_dead", item::RELAY_DEAD_MS)
                .expression_attribute_names("#relay_dead_shard", item::RELAY_DEAD_SHARD);
            match crate::ports::dead_lettered_at(deliveries, finish.now_ms) {
                Some(dead) => {
                    set.push(
                        "#relay_dead = :relay_dead, #relay_dead_shard = :relay_dead_shard".into(),
                    );
                    request = request
                        .expression_attribute_values(":relay_dead", n_attr(dead))
                        .expression_attribute_values(
                            ":relay_dead_shard",
                            s_attr(&item::sweep_shard(key.as_str())),
                        );
                }
                None => remove.push_str(", #relay_dead, #relay_dead_shard"),
            }
        }
        let result = request
            .update_expression(format!("SET {} REMOVE {remove}", set.join(", ")))
            .send()
            .await;
        conditional_update(result)
    }
}

/// A conditional UpdateItem's outcome: `true` when applied, `false` when its condition
/// failed (the caller decides whether that is a no-op); other failures are errors.
fn conditional_update(
    result: Result<UpdateItemOutput, SdkError<UpdateItemError, HttpResponse>>,
) -> Result<bool, StoreError> {
    match result {
        Ok(_) => Ok(true),
        Err(e) => error::refused(e).map(|_| false),
    }
}

fn newest_first(items: &mut Vec<InboxItem>, limit: usize) {
    items.sort_by(|a, b| {
        b.received_at_ms
            .cmp(&a.received_at_ms)
            .then_with(|| a.key.cmp(&b.key))
    });
    items.truncate(limit);
}

/// The attempts this delivery makes at least: the message's receives after the
/// postponements before it (each a fresh message, [`crate::ports::Queue::postpone`]),
/// for a run whose earlier attempts could not record themselves on the item.
fn attempts_so_far(delivery: &Delivery) -> u32 {
    delivery.receive_count.saturating_add(delivery.postponed)
}
