//! AWS adapter: the inbox on DynamoDB, the work queue on SQS.
//!
//! Round trips are paid for, so each port method is one call where possible:
//! `put_new` is a single conditional PutItem that returns the existing item on a
//! duplicate (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), `send` one SendMessage.
//! Conditional failures are matched on the SDK's service error variants, never on
//! strings; every other failure is classified once in [`error`].
//!
//! The processor's inbox writes ([`InboxProcessing`]) are one UpdateItem each, with
//! the allowed transitions in the condition expression: a claim returns the claimed
//! item (body included) with `ReturnValues=ALL_NEW`, and on a failed condition the
//! stored item (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), which tells a finished
//! item from one leased by a live worker without a second read.

pub(crate) mod error;
mod hints;
mod item;
mod query;
mod replay;
mod setup;
mod waiting;

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};

pub use setup::{
    config_source_from_env, create_all, create_queues, create_tables, load_config_from_env,
    load_config_from_ssm, load_config_with, AwsNames, AwsSetupError, SsmConfigLoader, CONFIG_ENV,
    CONFIG_PARAMETER_ENV, DLQ_URL_ENV, QUEUE_URL_ENV, TABLE_ENV,
};

use crate::envelope::InboxKey;
use crate::ports::{
    ClaimOutcome, Delivery, Finish, Inbox, InboxFilter, InboxItem, InboxProcessing, InboxState,
    PutOutcome, Queue, QueueError, QueueMessage, StoreError, WaitChange, WaitingScan,
};
use error::describe;

/// `list` with `limit == 0` returns this many items.
pub const DEFAULT_LIST_LIMIT: usize = 100;
/// SQS returns at most 10 messages per ReceiveMessage.
const SQS_MAX_BATCH: u32 = 10;
/// SQS caps visibility timeouts at 12 hours.
const SQS_MAX_VISIBILITY_SECS: u64 = 12 * 3600;

/// DynamoDB inbox + SQS queue. Cheap to clone (the SDK clients are `Arc`s inside).
#[derive(Debug, Clone)]
pub struct AwsStore {
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    table: String,
    queue_url: String,
    dlq_url: Option<String>,
}

impl AwsStore {
    pub fn new(
        dynamodb: aws_sdk_dynamodb::Client,
        sqs: aws_sdk_sqs::Client,
        names: AwsNames,
    ) -> Self {
        AwsStore {
            dynamodb,
            sqs,
            table: names.table,
            queue_url: names.queue_url,
            dlq_url: names.dlq_url,
        }
    }

    /// Clients for both services from one shared SDK config.
    pub fn from_sdk_config(sdk_config: &aws_config::SdkConfig, names: AwsNames) -> Self {
        Self::new(
            aws_sdk_dynamodb::Client::new(sdk_config),
            aws_sdk_sqs::Client::new(sdk_config),
            names,
        )
    }

    pub fn names(&self) -> AwsNames {
        AwsNames {
            table: self.table.clone(),
            queue_url: self.queue_url.clone(),
            dlq_url: self.dlq_url.clone(),
        }
    }

    pub fn dynamodb(&self) -> &aws_sdk_dynamodb::Client {
        &self.dynamodb
    }

    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    fn key_attr(key: &InboxKey) -> AttributeValue {
        AttributeValue::S(key.as_str().to_string())
    }

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

    async fn receive_from(
        &self,
        queue_url: &str,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let out = self
            .sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(max.min(SQS_MAX_BATCH) as i32)
            .visibility_timeout(visibility_secs(visibility))
            // Never long-poll here: callers decide how to wait.
            .wait_time_seconds(0)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS ReceiveMessage", &e)))?;
        out.messages
            .unwrap_or_default()
            .into_iter()
            .map(decode_message)
            .collect()
    }
}

/// The `AWSTraceHeader` system attribute value (a String).
pub fn trace_attribute(header: &str) -> Result<MessageSystemAttributeValue, QueueError> {
    MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        .map_err(|e| QueueError::Malformed(format!("trace header attribute: {e}")))
}

/// SQS takes whole seconds; round up so a short non-zero timeout never becomes 0.
fn visibility_secs(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.min(SQS_MAX_VISIBILITY_SECS) as i32
}

/// A malformed message names its id, never its body.
fn decode_message(m: aws_sdk_sqs::types::Message) -> Result<Delivery, QueueError> {
    let id = m.message_id.as_deref().unwrap_or("?").to_string();
    let malformed = |why: &str| QueueError::Malformed(format!("message {id}: {why}"));
    let receipt = m
        .receipt_handle
        .ok_or_else(|| malformed("no receipt handle"))?;
    let body = m.body.ok_or_else(|| malformed("no body"))?;
    let message: QueueMessage =
        serde_json::from_str(&body).map_err(|_| malformed("body is not a pointer message"))?;
    let receive_count = m
        .attributes
        .as_ref()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .ok_or_else(|| malformed("no ApproximateReceiveCount"))?
        .parse::<u32>()
        .map_err(|_| malformed("ApproximateReceiveCount is not a number"))?;
    Ok(Delivery {
        message,
        receipt,
        receive_count,
    })
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
            Err(e)
                if e.as_service_error()
                    .is_some_and(PutItemError::is_conditional_check_failed_exception) =>
            {
                let old = match e.into_service_error() {
                    PutItemError::ConditionalCheckFailedException(failed) => failed.item,
                    _ => None,
                };
                self.duplicate(old, &item.key, &put_id).await
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB PutItem", &e))),
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
            for m in out.items.unwrap_or_default() {
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
        match result {
            Ok(_) => Ok(()),
            // Missing or already past `received`: the processor owns it now.
            Err(e)
                if e.as_service_error()
                    .is_some_and(UpdateItemError::is_conditional_check_failed_exception) =>
            {
                Ok(())
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB UpdateItem", &e))),
        }
    }
}

/// The claim condition, shared with `mark_dead_letter`: the item exists and is
/// waiting (`received`, `queued`, `retryable`) or held by a lease that ran out.
const CLAIMABLE: &str =
    "attribute_exists(#pk) AND (#state IN (:received, :queued, :retryable, :waiting) \
     OR (#state = :processing AND (attribute_not_exists(#lease_until) OR #lease_until <= :now)))";

fn s_attr(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_string())
}

fn n_attr(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
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
        let result = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, Self::key_attr(key))
            .update_expression(
                "SET #state = :processing, #lease_owner = :owner, #lease_until = :until, \
                 #updated = :now, #attempts = if_not_exists(#attempts, :zero) + :one",
            )
            // Leaves the sweeper's index alone: its key (shard, received_at_ms) is
            // constant while the item is pending, so a claim writes only the table.
            .condition_expression(CLAIMABLE)
            .expression_attribute_names("#pk", item::PK)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#attempts", item::ATTEMPTS)
            .expression_attribute_values(":received", s_attr(InboxState::Received.as_str()))
            .expression_attribute_values(":queued", s_attr(InboxState::Queued.as_str()))
            .expression_attribute_values(":retryable", s_attr(InboxState::Retryable.as_str()))
            .expression_attribute_values(":waiting", s_attr(InboxState::Waiting.as_str()))
            .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
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
                let claimed = out.attributes.ok_or_else(|| {
                    StoreError::Unavailable(format!(
                        "DynamoDB UpdateItem: claim of {key} returned no item"
                    ))
                })?;
                let claimed = item::decode(claimed).map_err(StoreError::Corrupt)?;
                Ok(ClaimOutcome::Claimed(Box::new(claimed)))
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(UpdateItemError::is_conditional_check_failed_exception) =>
            {
                let old = match e.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(failed) => failed.item,
                    _ => None,
                };
                self.claim_refused(old, key, now_ms).await
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB UpdateItem", &e))),
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
        let result = request
            .update_expression(format!("SET {} REMOVE {remove}", set.join(", ")))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(UpdateItemError::is_conditional_check_failed_exception) =>
            {
                Ok(false)
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB UpdateItem", &e))),
        }
    }

    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let result = self
            .dynamodb
            .update_item()
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
            .expression_attribute_values(":waiting", s_attr(InboxState::Waiting.as_str()))
            .condition_expression(CLAIMABLE)
            .expression_attribute_names("#pk", item::PK)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#error", item::LAST_ERROR)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
            .expression_attribute_values(":dead", s_attr(InboxState::DeadLetter.as_str()))
            .expression_attribute_values(":reason", s_attr(reason))
            .expression_attribute_values(":now", n_attr(now_ms))
            .expression_attribute_values(":received", s_attr(InboxState::Received.as_str()))
            .expression_attribute_values(":queued", s_attr(InboxState::Queued.as_str()))
            .expression_attribute_values(":retryable", s_attr(InboxState::Retryable.as_str()))
            .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Missing, already terminal, or a live worker will finish it.
            Err(e)
                if e.as_service_error()
                    .is_some_and(UpdateItemError::is_conditional_check_failed_exception) =>
            {
                Ok(())
            }
            Err(e) => Err(StoreError::Unavailable(describe("DynamoDB UpdateItem", &e))),
        }
    }

    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        self.waiters_of(record_pk, limit).await
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

#[async_trait]
impl Queue for AwsStore {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        self.send_traced(message, None).await
    }

    /// One SendMessage; with a trace header, it travels as the message system
    /// attribute `AWSTraceHeader` (X-Ray links the receiver's and processor's traces).
    async fn send_traced(
        &self,
        message: &QueueMessage,
        trace_header: Option<&str>,
    ) -> Result<(), QueueError> {
        let body = serde_json::to_string(message)
            .map_err(|e| QueueError::Malformed(format!("cannot serialize message: {e}")))?;
        let mut request = self
            .sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body);
        if let Some(header) = trace_header {
            request = request.message_system_attributes(
                MessageSystemAttributeNameForSends::AwsTraceHeader,
                trace_attribute(header)?,
            );
        }
        request
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS SendMessage", &e)))?;
        Ok(())
    }

    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(&self.queue_url, max, visibility).await
    }

    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let dlq = self.dlq_url.as_deref().ok_or_else(|| {
            QueueError::Unavailable(format!("no dead-letter queue configured ({DLQ_URL_ENV})"))
        })?;
        let body = serde_json::to_string(message)
            .map_err(|e| QueueError::Malformed(format!("cannot serialize message: {e}")))?;
        self.sqs
            .send_message()
            .queue_url(dlq)
            .message_body(body)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS SendMessage (DLQ)", &e)))?;
        Ok(())
    }

    async fn ack(&self, receipt: &str) -> Result<(), QueueError> {
        self.sqs
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS DeleteMessage", &e)))?;
        Ok(())
    }

    async fn change_visibility(
        &self,
        receipt: &str,
        visibility: Duration,
    ) -> Result<(), QueueError> {
        self.sqs
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(visibility_secs(visibility))
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS ChangeMessageVisibility", &e)))?;
        Ok(())
    }

    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let dlq = self.dlq_url.as_deref().ok_or_else(|| {
            QueueError::Unavailable(format!("no dead-letter queue configured ({DLQ_URL_ENV})"))
        })?;
        self.receive_from(dlq, max, visibility).await
    }
}

/// BatchGetItem reads at most this many keys per call.
pub(crate) const BATCH_GET_MAX: usize = 100;
/// Rounds of BatchGetItem retries for keys DynamoDB left unprocessed (throttling).
const BATCH_GET_ATTEMPTS: u32 = 8;

/// Whether `item` is what [`crate::ports::InboxSweep::stuck`] returns for
/// `older_than_ms`: `received`, `queued` or `retryable` last updated before it, `processing`
/// whose lease ran out before it. The embedded store's SQL says the same.
/// The key maps of `pks` for a BatchGetItem request.
pub(crate) fn batch_keys(pks: &[String]) -> Vec<item::Item> {
    pks.iter()
        .map(|pk| item::Item::from([(item::PK.to_string(), s_attr(pk))]))
        .collect()
}

fn sweepable(item: &InboxItem, older_than_ms: i64) -> bool {
    match item.state {
        InboxState::Received | InboxState::Queued | InboxState::Retryable => {
            item.updated_at_ms < older_than_ms
        }
        InboxState::Processing => {
            item.updated_at_ms < older_than_ms
                && item
                    .lease_until_ms
                    .is_none_or(|until| until < older_than_ms)
        }
        _ => false,
    }
}

/// One page of a shard's index range (`sweep_shard = shard AND received_at_ms < cutoff`).
struct ShardCursor {
    shard: String,
    start: Option<item::Item>,
    done: bool,
}

impl AwsStore {
    /// The keys of one page of `cursor`'s shard, oldest receipt first; advances it.
    async fn sweep_page(
        &self,
        cursor: &mut ShardCursor,
        older_than_ms: i64,
        page: i32,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let out = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(item::BY_SWEEP_SHARD)
            .key_condition_expression("#shard = :shard AND #received < :cutoff")
            .expression_attribute_names("#shard", item::SWEEP_SHARD)
            .expression_attribute_names("#received", item::RECEIVED_AT_MS)
            .expression_attribute_values(":shard", s_attr(&cursor.shard))
            .expression_attribute_values(":cutoff", n_attr(older_than_ms))
            .scan_index_forward(true)
            .limit(page)
            .set_exclusive_start_key(cursor.start.take())
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(describe("DynamoDB Query", &e)))?;
        cursor.start = out.last_evaluated_key;
        cursor.done = cursor.start.is_none();
        let mut keys = Vec::new();
        for m in out.items.unwrap_or_default() {
            let pk = match m.get(item::PK) {
                Some(AttributeValue::S(pk)) => pk.clone(),
                _ => {
                    return Err(StoreError::Corrupt(format!(
                        "index {}: entry without a string pk",
                        item::BY_SWEEP_SHARD
                    )))
                }
            };
            let received = match m.get(item::RECEIVED_AT_MS) {
                Some(AttributeValue::N(n)) => n.parse().unwrap_or(i64::MAX),
                _ => i64::MAX,
            };
            keys.push((received, pk));
        }
        Ok(keys)
    }

    /// The current items of `keys` (consistent reads, BatchGetItem of up to 100),
    /// in no particular order; keys deleted in between are simply absent.
    async fn read_items(&self, keys: &[String]) -> Result<Vec<InboxItem>, StoreError> {
        let mut items = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let wanted = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                .set_keys(Some(batch_keys(chunk)))
                .consistent_read(true)
                .build()
                .map_err(|e| StoreError::Unavailable(format!("DynamoDB BatchGetItem: {e}")))?;
            for m in self.batch_get(wanted).await? {
                items.push(item::decode(m).map_err(StoreError::Corrupt)?);
            }
        }
        Ok(items)
    }

    /// One BatchGetItem of at most [`BATCH_GET_MAX`] keys on the inbox table, retrying
    /// the keys DynamoDB leaves unprocessed (throttling) with a growing pause.
    pub(crate) async fn batch_get(
        &self,
        mut wanted: aws_sdk_dynamodb::types::KeysAndAttributes,
    ) -> Result<Vec<item::Item>, StoreError> {
        let mut found = Vec::new();
        let mut attempt = 0;
        loop {
            let out = self
                .dynamodb
                .batch_get_item()
                .request_items(&self.table, wanted)
                .send()
                .await
                .map_err(|e| StoreError::Unavailable(describe("DynamoDB BatchGetItem", &e)))?;
            if let Some(mut responses) = out.responses {
                found.extend(responses.remove(&self.table).unwrap_or_default());
            }
            match out
                .unprocessed_keys
                .and_then(|mut left| left.remove(&self.table))
                .filter(|left| !left.keys().is_empty())
            {
                None => return Ok(found),
                Some(left) => {
                    attempt += 1;
                    if attempt >= BATCH_GET_ATTEMPTS {
                        return Err(StoreError::Unavailable(format!(
                            "DynamoDB BatchGetItem: {} keys still unprocessed after \
                             {attempt} attempts",
                            left.keys().len()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(25 << attempt.min(6))).await;
                    wanted = left;
                }
            }
        }
    }
}

/// The sweeper: one Query per shard of the sparse, KEYS_ONLY `by_sweep_shard` index
/// (hash `sweep_shard`, range `received_at_ms`), oldest receipt first, then a
/// consistent BatchGetItem of the candidates, which are checked against the same rules
/// as the embedded store's; never a Scan. An item's `updated_at_ms` is never before its
/// `received_at_ms`, so the index range holds every item that qualifies. Candidates
/// that do not (a live lease, a recent retry) cost a read each, and pending items are
/// few: those in flight and the rare stuck ones.
#[async_trait]
impl crate::ports::InboxSweep for AwsStore {
    async fn stuck(&self, older_than_ms: i64, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        let mut found: Vec<InboxItem> = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        let page = limit.min(1000) as i32;
        let mut cursors: Vec<ShardCursor> = item::sweep_shards()
            .map(|shard| ShardCursor {
                shard,
                start: None,
                done: false,
            })
            .collect();
        // Round by round, one page per unfinished shard, until `limit` items qualify
        // or every shard's range is read: candidates that do not qualify never hide
        // the ones behind them.
        while found.len() < limit && cursors.iter().any(|c| !c.done) {
            let mut candidates = Vec::new();
            for cursor in cursors.iter_mut().filter(|c| !c.done) {
                candidates.extend(self.sweep_page(cursor, older_than_ms, page).await?);
            }
            // Oldest receipt first, 100 keys per read, no more reads than `limit` needs
            // (a backlog of thousands costs one page of reads per pass, not all of it).
            candidates.sort();
            let keys: Vec<String> = candidates.into_iter().map(|(_, pk)| pk).collect();
            for chunk in keys.chunks(BATCH_GET_MAX) {
                found.extend(
                    self.read_items(chunk)
                        .await?
                        .into_iter()
                        .filter(|item| sweepable(item, older_than_ms)),
                );
                if found.len() >= limit {
                    break;
                }
            }
        }
        found.sort_by(|a, b| {
            a.updated_at_ms
                .cmp(&b.updated_at_ms)
                .then_with(|| a.key.cmp(&b.key))
        });
        found.truncate(limit);
        Ok(found)
    }

    async fn waiting(&self, due_before_ms: i64, limit: usize) -> Result<WaitingScan, StoreError> {
        self.waiting_scan(due_before_ms, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_rounds_up_and_caps() {
        assert_eq!(visibility_secs(Duration::ZERO), 0);
        assert_eq!(visibility_secs(Duration::from_millis(1)), 1);
        assert_eq!(visibility_secs(Duration::from_secs(30)), 30);
        assert_eq!(visibility_secs(Duration::from_secs(1 << 40)), 43_200);
    }

    #[test]
    fn malformed_messages_name_the_id_not_the_body() {
        let m = aws_sdk_sqs::types::Message::builder()
            .message_id("m-1")
            .receipt_handle("r")
            .body("secret customer data")
            .build();
        let err = decode_message(m).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("m-1") && !text.contains("secret"), "{text}");
    }
}
