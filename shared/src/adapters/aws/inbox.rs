//! [`Inbox`] and [`InboxProcessing`] on DynamoDB: the receiver's conditional put and
//! the processor's claim/finish, each one call with the allowed transitions in the
//! condition expression.

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
    ClaimOutcome, Finish, Inbox, InboxFilter, InboxItem, InboxProcessing, InboxState, PutOutcome,
    StoreError, WaitChange,
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
        match result {
            Ok(_) => Ok(PutOutcome::Inserted),
            Err(e) => {
                let old = error::refused(e)?;
                self.duplicate(old, &item.key, &put_id).await
            }
        }
    }

    async fn get(&self, key: &InboxKey) -> Result<Option<InboxItem>, StoreError> {
        self.get_raw(key)
            .await?
            .map(|m| item::decode(m).map_err(StoreError::Corrupt))
            .transpose()
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
            Ok(out) => Ok(ClaimOutcome::Claimed(Box::new(item::decode_returned(
                out.attributes,
                "claim",
                key,
            )?))),
            Err(e) => {
                let old = error::refused(e)?;
                self.claim_refused(old, key, now_ms).await
            }
        }
    }

    async fn finish(
        &self,
        key: &InboxKey,
        owner: &str,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        let mut set = vec!["#state = :state".to_string(), "#updated = :now".to_string()];
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .condition_expression("#state = :processing AND #lease_owner = :owner")
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
            .expression_attribute_values(":state", s_attr(finish.state.as_str()))
            .expression_attribute_values(":now", n_attr(finish.now_ms))
            .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
            .expression_attribute_values(":owner", s_attr(owner));
        // Optional fields: set when given, left alone otherwise. The attribute names
        // are plain identifiers, so they serve as their own placeholders.
        for (attr, value) in [
            (item::LAST_ERROR_CLASS, &finish.error_class),
            (item::LAST_ERROR, &finish.error),
            (item::RESULT, &finish.result),
        ] {
            if let Some(value) = value {
                set.push(format!("#{attr} = :{attr}"));
                request = request
                    .expression_attribute_names(format!("#{attr}"), attr)
                    .expression_attribute_values(format!(":{attr}"), s_attr(value));
            }
        }
        // The sweeper's sparse index: untouched while the item stays pending (a retry
        // writes no index entry), left once terminal (one index delete).
        let mut remove = "#lease_owner, #lease_until".to_string();
        match &finish.wait {
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
        }
        let result = request
            .update_expression(format!("SET {} REMOVE {remove}", set.join(", ")))
            .send()
            .await;
        conditional_update(result)
    }

    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let result = claimable(self.dynamodb.update_item())
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression(
                "SET #state = :dead, #error = :reason, #updated = :now \
                 REMOVE #lease_owner, #lease_until, #shard, #wait_on, #wait_shard, #wait_since",
            )
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
        // Missing, already terminal, or a live worker will finish it.
        conditional_update(result).map(|_| ())
    }

    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        self.waiters_of(record_pk, limit).await
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
