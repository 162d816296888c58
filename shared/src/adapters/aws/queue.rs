//! [`Queue`] on SQS: pointer messages to the work queue and the dead-letter queue,
//! each one call.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};

use super::error::describe;
use super::{AwsStore, DLQ_URL_ENV};
use crate::ports::{Delivery, Queue, QueueError, QueueMessage};

/// SQS returns at most 10 messages per ReceiveMessage.
const SQS_MAX_BATCH: u32 = 10;
/// SQS caps visibility timeouts at 12 hours.
const SQS_MAX_VISIBILITY_SECS: u64 = 12 * 3600;

impl AwsStore {
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
fn trace_attribute(header: &str) -> Result<MessageSystemAttributeValue, QueueError> {
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
