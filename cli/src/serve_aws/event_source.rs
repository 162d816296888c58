//! The SQS event source mapping, as Lambda runs it for the processor: receive up to
//! the batch size within the batching window, invoke the processor's own handler with
//! an `SqsEvent`, then delete every message the partial batch response
//! (`ReportBatchItemFailures`) did not report. A reported message is left alone: it
//! comes back after its visibility (the processor sets it for a retry), and after the
//! queue's `maxReceiveCount` receives SQS itself moves it to the dead-letter queue.
//! Receives use the queue's own visibility timeout, as Lambda's pollers do.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use einmal::pipeline::process::Processor;
use tokio::sync::watch;

/// The most messages one ReceiveMessage returns.
const MAX_PER_RECEIVE: u32 = 10;
/// After a failed receive: back off instead of hammering an endpoint in trouble.
const RECEIVE_ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Between short polls while a batching window is open.
const WINDOW_POLL_PAUSE: Duration = Duration::from_millis(50);

#[derive(Clone)]
pub struct EventSource {
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
    pub queue_arn: String,
    pub region: String,
    pub batch_size: u32,
    pub batching_window: Duration,
    pub poll_wait_secs: u32,
    /// After an empty short poll (`poll_wait_secs` 0).
    pub idle_pause: Duration,
    pub emf: bool,
    pub deployment: String,
}

/// What one poller did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Polled {
    pub batches: u64,
    pub messages: u64,
}

impl EventSource {
    /// Poll until `stop` turns true; a batch in hand is processed and settled first.
    pub async fn run(
        &self,
        n: u64,
        processor: &Processor,
        mut stop: watch::Receiver<bool>,
    ) -> Polled {
        let mut polled = Polled::default();
        loop {
            if *stop.borrow() {
                return polled;
            }
            // A receive in flight is abandoned on stop: what it would have returned
            // stays in the queue and comes back after the visibility timeout.
            let batch = tokio::select! {
                batch = self.gather() => batch,
                _ = stop.wait_for(|stopped| *stopped) => return polled,
            };
            let messages = match batch {
                Ok(messages) => messages,
                Err(e) => {
                    tracing::warn!(poller = n, error = %e, "SQS receive failed; retrying");
                    tokio::time::sleep(RECEIVE_ERROR_PAUSE).await;
                    continue;
                }
            };
            if messages.is_empty() {
                if self.poll_wait_secs == 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(self.idle_pause) => {}
                        _ = stop.wait_for(|stopped| *stopped) => return polled,
                    }
                }
                continue;
            }
            polled.batches += 1;
            polled.messages += messages.len() as u64;
            self.invoke(processor, messages).await;
        }
    }

    /// One batch: the first receive waits up to `poll_wait_secs`; once a message is
    /// in hand, more are gathered until the batch is full or the window closes.
    async fn gather(&self) -> Result<Vec<Message>, String> {
        let mut batch = self.receive(self.batch_size, self.poll_wait_secs).await?;
        if batch.is_empty() {
            return Ok(batch);
        }
        let opened = Instant::now();
        while (batch.len() as u32) < self.batch_size && opened.elapsed() < self.batching_window {
            let more = self
                .receive(self.batch_size - batch.len() as u32, 0)
                .await?;
            if more.is_empty() {
                tokio::time::sleep(WINDOW_POLL_PAUSE).await;
            }
            batch.extend(more);
        }
        Ok(batch)
    }

    async fn receive(&self, want: u32, wait_secs: u32) -> Result<Vec<Message>, String> {
        let out = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(want.min(MAX_PER_RECEIVE) as i32)
            .wait_time_seconds(wait_secs as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
        Ok(out.messages.unwrap_or_default())
    }

    /// Invoke the processor's handler with the batch, then delete what it did not report.
    async fn invoke(&self, processor: &Processor, messages: Vec<Message>) {
        let receipts: HashMap<String, String> = messages
            .iter()
            .filter_map(|m| Some((m.message_id.clone()?, m.receipt_handle.clone()?)))
            .collect();
        let event = SqsEvent {
            records: messages.into_iter().map(|m| self.record(m)).collect(),
        };
        // A Lambda request id per invocation: the worker id its leases carry.
        let request_id = format!("serve-{:032x}", rand::random::<u128>());
        let response = if self.emf {
            processor::handle_and_emit(processor, &self.deployment, event, &request_id, None).await
        } else {
            processor::handle_as(processor, event, &request_id).await
        };
        let failed: std::collections::HashSet<&str> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        let done: Vec<(&String, &String)> = receipts
            .iter()
            .filter(|(id, _)| !failed.contains(id.as_str()))
            .collect();
        for chunk in done.chunks(MAX_PER_RECEIVE as usize) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, (_, receipt))| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt.as_str())
                        .build()
                        .ok()
                })
                .collect();
            let deleted = self
                .sqs
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            // Not deleted: the message comes back and the processor finds it done.
            match deleted {
                Ok(out) if !out.failed.is_empty() => tracing::warn!(
                    failed = out.failed.len(),
                    "SQS DeleteMessageBatch left messages; they will be redelivered"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = %aws_sdk_sqs::error::DisplayErrorContext(&e),
                    "SQS DeleteMessageBatch failed; the messages will be redelivered"
                ),
            }
        }
    }

    /// An SQS message as the event source hands it to Lambda.
    fn record(&self, m: Message) -> SqsMessage {
        let attributes = m
            .attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.as_str().to_string(), v))
            .collect();
        let message_attributes = m
            .message_attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let attribute = SqsMessageAttribute {
                    string_value: v.string_value,
                    binary_value: v
                        .binary_value
                        .map(|b| aws_lambda_events::encodings::Base64Data(b.into_inner())),
                    data_type: Some(v.data_type),
                    ..Default::default()
                };
                (k, attribute)
            })
            .collect();
        SqsMessage {
            message_id: m.message_id,
            receipt_handle: m.receipt_handle,
            body: m.body,
            md5_of_body: m.md5_of_body,
            md5_of_message_attributes: m.md5_of_message_attributes,
            attributes,
            message_attributes,
            event_source_arn: Some(self.queue_arn.clone()),
            event_source: Some("aws:sqs".to_string()),
            aws_region: Some(self.region.clone()),
        }
    }
}
