//! Operator replay on DynamoDB + SQS: requeue an inbox item (one conditional
//! UpdateItem), remove or release dead letters on the DLQ.

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::error::{self, describe};
use super::item::{self, s_attr};
use super::{AwsStore, DLQ_URL_ENV};
use crate::envelope::InboxKey;
use crate::ports::{
    DeadLetterQueue, InboxItem, InboxReplay, InboxState, QueueError, RequeueOutcome, StoreError,
};

/// Requeueable without force: waiting, failed, or held by a lease that ran out.
const REQUEUEABLE: &str =
    "attribute_exists(#pk) AND (#state IN (:dead, :retryable, :received, :queued, :waiting) \
     OR (#state = :processing AND (attribute_not_exists(#lease_until) OR #lease_until <= :now)))";

fn refused(
    old: Option<InboxItem>,
    key: &InboxKey,
    now_ms: i64,
) -> Result<RequeueOutcome, StoreError> {
    match old {
        None => Ok(RequeueOutcome::Missing),
        Some(old) => match (old.state, old.lease_until_ms) {
            (InboxState::Completed | InboxState::Ignored, _) => {
                Ok(RequeueOutcome::AlreadyDone(old.state))
            }
            (InboxState::Processing, Some(until_ms)) if until_ms > now_ms => {
                Ok(RequeueOutcome::Busy { until_ms })
            }
            // Requeueable after all: a read raced a concurrent change. Retry later.
            (state, _) => Err(StoreError::Unavailable(format!(
                "DynamoDB UpdateItem: requeue of {key} refused in state {state}"
            ))),
        },
    }
}

impl AwsStore {
    fn dlq(&self) -> Result<&str, QueueError> {
        self.dlq_url.as_deref().ok_or_else(|| {
            QueueError::Unavailable(format!("no dead-letter queue configured ({DLQ_URL_ENV})"))
        })
    }
}

#[async_trait]
impl InboxReplay for AwsStore {
    async fn requeue(
        &self,
        key: &InboxKey,
        force: bool,
        now_ms: i64,
    ) -> Result<RequeueOutcome, StoreError> {
        let mut condition = REQUEUEABLE.to_string();
        // Pending again: back in the sweeper's index (a no-op for an item still in it),
        // so a worker that crashes on the replayed item is found like any other.
        let set = "SET #state = :queued, #updated = :now, #shard = :shard".to_string();
        let mut request = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key(item::PK, AwsStore::key_attr(key))
            .expression_attribute_names("#pk", item::PK)
            .expression_attribute_names("#state", item::STATE)
            .expression_attribute_names("#updated", item::UPDATED_AT_MS)
            .expression_attribute_names("#lease_owner", item::LEASE_OWNER)
            .expression_attribute_names("#lease_until", item::LEASE_UNTIL_MS)
            .expression_attribute_names("#shard", item::SWEEP_SHARD)
            .expression_attribute_values(":shard", s_attr(&item::sweep_shard(key.as_str())))
            .expression_attribute_values(":queued", s_attr(InboxState::Queued.as_str()))
            .expression_attribute_values(":dead", s_attr(InboxState::DeadLetter.as_str()))
            .expression_attribute_values(":retryable", s_attr(InboxState::Retryable.as_str()))
            .expression_attribute_values(":waiting", s_attr(InboxState::Waiting.as_str()))
            .expression_attribute_values(":received", s_attr(InboxState::Received.as_str()))
            .expression_attribute_values(":processing", s_attr(InboxState::Processing.as_str()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()));
        if force {
            condition = format!(
                "attribute_exists(#pk) AND (({condition}) OR #state IN (:completed, :ignored))"
            );
            // The result stays: a forced replay that finds every effect applied keeps it.
            request = request
                .expression_attribute_values(":completed", s_attr(InboxState::Completed.as_str()))
                .expression_attribute_values(":ignored", s_attr(InboxState::Ignored.as_str()));
        }
        let result = request
            .condition_expression(condition)
            .update_expression(format!("{set} REMOVE #lease_owner, #lease_until"))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(out) => {
                let from = match out.attributes {
                    Some(old) => item::decode(old).map_err(StoreError::Corrupt)?.state,
                    None => InboxState::Queued,
                };
                Ok(RequeueOutcome::Requeued { from })
            }
            Err(e) => {
                let old = match error::refused(e)? {
                    Some(old) => Some(item::decode(old).map_err(StoreError::Corrupt)?),
                    // A compatible server that ignores ALL_OLD (or no item): one read.
                    None => crate::ports::Inbox::get(self, key).await?,
                };
                refused(old, key, now_ms)
            }
        }
    }
}

#[async_trait]
impl DeadLetterQueue for AwsStore {
    async fn delete_dead_letter(&self, receipt: &str) -> Result<(), QueueError> {
        self.sqs
            .delete_message()
            .queue_url(self.dlq()?)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS DeleteMessage (DLQ)", &e)))?;
        Ok(())
    }

    async fn release_dead_letter(&self, receipt: &str) -> Result<(), QueueError> {
        self.sqs
            .change_message_visibility()
            .queue_url(self.dlq()?)
            .receipt_handle(receipt)
            .visibility_timeout(0)
            .send()
            .await
            .map_err(|e| {
                QueueError::Unavailable(describe("SQS ChangeMessageVisibility (DLQ)", &e))
            })?;
        Ok(())
    }
}
