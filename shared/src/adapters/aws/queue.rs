//! [`Queue`] on SQS: messages to the work queue and the dead-letter queue, each one
//! call.
//!
//! The receiver's message for a new event carries the item and its compressed body
//! ([`Queue::send_item`]; JSON `{"pk", "item", "body"}`, the body base64), so the
//! processor starts without a DynamoDB call (`inbox.rs`, `begin`). An item whose
//! message would pass [`MAX_CARRIED_BYTES`] (SQS takes 256 KiB) goes as the pointer
//! alone, and the processor reads its body item. Every other message (wakes, re-sends,
//! replays, dead letters) is the pointer `{"pk"}`, which is also what a previous
//! release sent and still reads (it ignores the other fields).

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::error::describe;
use super::{AwsStore, DLQ_URL_ENV};
use crate::envelope::InboxKey;
use crate::ports::{Delivery, InboxItem, Queue, QueueError, QueueMessage};

/// The largest message that carries its item: below SQS's 256 KiB (262,144 bytes,
/// body and attributes together), leaving room for the trace header attribute.
pub const MAX_CARRIED_BYTES: usize = 250 * 1024;

/// A message as it travels: the pointer, and for the receiver's send the item.
#[derive(Serialize, Deserialize)]
struct Wire {
    pk: InboxKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    item: Option<InboxItem>,
    /// The compressed body of `item`, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    /// How often the event's message was postponed before ([`Queue::postpone`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    postponed: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A message body decoded: the pointer, the item it carries, and how often the
/// event's message was postponed before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    pub message: QueueMessage,
    pub item: Option<Box<InboxItem>>,
    pub postponed: u32,
}

/// The JSON body of `item`'s message: the item with its body, or the pointer alone
/// when that would pass [`MAX_CARRIED_BYTES`].
fn item_message(item: &InboxItem) -> Result<String, QueueError> {
    let carried = Wire {
        pk: item.key.clone(),
        item: Some(item.clone()),
        body: Some(base64::engine::general_purpose::STANDARD.encode(&item.body)),
        postponed: 0,
    };
    let text = serde_json::to_string(&carried)
        .map_err(|e| QueueError::Malformed(format!("cannot serialize message: {e}")))?;
    if text.len() <= MAX_CARRIED_BYTES {
        return Ok(text);
    }
    pointer_message(&QueueMessage {
        pk: item.key.clone(),
    })
}

fn pointer_message(message: &QueueMessage) -> Result<String, QueueError> {
    serde_json::to_string(message)
        .map_err(|e| QueueError::Malformed(format!("cannot serialize message: {e}")))
}

/// A message body as the pointer and the item it carries, if any. The error says
/// what is wrong, never the content. The processor Lambda decodes its SQS records
/// with it.
pub fn decode_message_body(body: &str) -> Result<DecodedMessage, &'static str> {
    let wire: Wire = serde_json::from_str(body).map_err(|_| "body is not a pointer message")?;
    let item = match (wire.item, wire.body) {
        (None, None) => None,
        (Some(mut item), Some(body)) => {
            if item.key != wire.pk {
                return Err("the carried item is not the pointer's");
            }
            item.body = base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|_| "the carried body is not base64")?;
            if item.body.is_empty() {
                return Err("the carried body is empty");
            }
            Some(Box::new(item))
        }
        _ => return Err("a carried item without its body, or a body without its item"),
    };
    Ok(DecodedMessage {
        message: QueueMessage { pk: wire.pk },
        item,
        postponed: wire.postponed,
    })
}

/// The pointer of a postponed message: `{"pk", "postponed"}`.
fn postponed_message(message: &QueueMessage, postponed: u32) -> Result<String, QueueError> {
    let wire = Wire {
        pk: message.pk.clone(),
        item: None,
        body: None,
        postponed,
    };
    serde_json::to_string(&wire)
        .map_err(|e| QueueError::Malformed(format!("cannot serialize message: {e}")))
}

/// SQS returns at most 10 messages per ReceiveMessage.
const SQS_MAX_BATCH: u32 = 10;
/// SQS caps visibility timeouts at 12 hours.
const SQS_MAX_VISIBILITY_SECS: u64 = 12 * 3600;

impl AwsStore {
    /// One SendMessage to the work queue; with a trace header, it travels as the
    /// message system attribute `AWSTraceHeader` (X-Ray links the receiver's and
    /// processor's traces).
    async fn send_body(&self, body: String, trace_header: Option<&str>) -> Result<(), QueueError> {
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
    let decoded = decode_message_body(&body).map_err(malformed)?;
    let receive_count = m
        .attributes
        .as_ref()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .ok_or_else(|| malformed("no ApproximateReceiveCount"))?
        .parse::<u32>()
        .map_err(|_| malformed("ApproximateReceiveCount is not a number"))?;
    Ok(Delivery {
        message: decoded.message,
        receipt,
        receive_count,
        item: decoded.item,
        postponed: decoded.postponed,
    })
}

/// SQS delays a message by at most 15 minutes.
const SQS_MAX_DELAY_SECS: u64 = 900;

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
        self.send_body(pointer_message(message)?, trace_header)
            .await
    }

    async fn send_item(
        &self,
        item: &InboxItem,
        trace_header: Option<&str>,
    ) -> Result<(), QueueError> {
        self.send_body(item_message(item)?, trace_header).await
    }

    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.receive_from(&self.queue_url, max, visibility).await
    }

    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let dlq = self.dlq_url.as_deref().ok_or_else(|| {
            QueueError::Unavailable(format!("no dead-letter queue configured ({DLQ_URL_ENV})"))
        })?;
        let body = pointer_message(message)?;
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

    /// SendMessage of the pointer with `DelaySeconds` (at most 15 minutes, SQS's
    /// limit), then DeleteMessage of the received one: the new message starts at
    /// receive count 0. A delete that fails leaves two messages of one event, which
    /// the processor handles like any duplicate.
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> Result<(), QueueError> {
        let body = postponed_message(&delivery.message, delivery.postponed.saturating_add(1))?;
        let delay_secs =
            (delay.as_secs() + u64::from(delay.subsec_nanos() > 0)).min(SQS_MAX_DELAY_SECS) as i32;
        self.sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .delay_seconds(delay_secs)
            .send()
            .await
            .map_err(|e| QueueError::Unavailable(describe("SQS SendMessage (postpone)", &e)))?;
        self.ack(&delivery.receipt).await
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

    fn item(body: Vec<u8>) -> InboxItem {
        InboxItem {
            body,
            ..crate::adapters::aws::item::tests::sample()
        }
    }

    #[test]
    fn the_receivers_message_carries_the_item_and_its_body() {
        let sent = item(vec![40, 181, 47, 253, 0, 1, 2, 255]);
        let text = item_message(&sent).unwrap();
        let decoded = decode_message_body(&text).unwrap();
        let message = decoded.message;
        assert_eq!(message.pk, sent.key);
        assert_eq!(decoded.item.as_deref(), Some(&sent));
        assert_eq!(decoded.postponed, 0);
        // What a previous release reads of it: the pointer.
        let old: QueueMessage = serde_json::from_str(&text).unwrap();
        assert_eq!(old.pk, sent.key);
        // And a pointer (a previous release's, a wake, a re-send) carries nothing.
        let pointer = pointer_message(&message).unwrap();
        let decoded = decode_message_body(&pointer).unwrap();
        assert_eq!((decoded.message, decoded.item), (message.clone(), None));
        // A postponed pointer counts its postponements; older releases read the pointer.
        let postponed = postponed_message(&message, 3).unwrap();
        assert_eq!(decode_message_body(&postponed).unwrap().postponed, 3);
        let old: QueueMessage = serde_json::from_str(&postponed).unwrap();
        assert_eq!(old, message);
    }

    #[test]
    fn an_item_too_large_for_one_message_goes_as_its_pointer() {
        // Incompressible bytes whose base64 passes the bound.
        let body: Vec<u8> = (0..MAX_CARRIED_BYTES)
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        let text = item_message(&item(body)).unwrap();
        assert!(text.len() < 200, "{}", text.len());
        let carried = decode_message_body(&text).unwrap().item;
        assert!(carried.is_none());
    }

    #[test]
    fn a_carried_item_must_match_its_pointer_and_bring_its_body() {
        let mut wire: serde_json::Value =
            serde_json::from_str(&item_message(&item(vec![1, 2, 3])).unwrap()).unwrap();
        let mut other = wire.clone();
        other["pk"] = serde_json::json!("stripe#t1#evt_2");
        assert!(decode_message_body(&other.to_string()).is_err());
        let mut bad = wire.clone();
        bad["body"] = serde_json::json!("not base64 !");
        assert!(decode_message_body(&bad.to_string()).is_err());
        wire.as_object_mut().unwrap().remove("body");
        assert!(decode_message_body(&wire.to_string()).is_err());
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
