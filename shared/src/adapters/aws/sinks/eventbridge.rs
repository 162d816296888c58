//! The EventBridge kind: `PutEvents` of one entry per delivery.

use async_trait::async_trait;

use super::{detail_json, short, sink_error, EVENTBRIDGE_MAX_ENTRY_BYTES};
use crate::destinations::config::EventBridgeDestination;
use crate::destinations::fields::Fields;
use crate::destinations::{Delivered, Message, Sink, SinkError};

/// `PutEvents` of one entry to one bus (name or ARN).
#[derive(Debug, Clone)]
pub struct EventBridgeSink {
    client: aws_sdk_eventbridge::Client,
    bus: String,
}

impl EventBridgeSink {
    pub fn new(client: aws_sdk_eventbridge::Client, bus: &str) -> Self {
        EventBridgeSink {
            client,
            bus: bus.to_string(),
        }
    }
}

/// `einmal.{provider}`.
pub fn eventbridge_source(message: &Message) -> String {
    format!("einmal.{}", message.provider)
}

#[async_trait]
impl Sink for EventBridgeSink {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        let source = eventbridge_source(message);
        let detail = detail_json(message, false);
        let time = message
            .occurred_at
            .map(aws_sdk_eventbridge::primitives::DateTime::from_secs);
        let size = time.map_or(0, |_| 14) + source.len() + message.event_type.len() + detail.len();
        if size > EVENTBRIDGE_MAX_ENTRY_BYTES {
            return Err(SinkError::Permanent {
                status: None,
                detail: format!(
                    "EventBridge PutEvents: the event is {size} bytes, over the \
                     {EVENTBRIDGE_MAX_ENTRY_BYTES}-byte limit of PutEvents"
                ),
            });
        }
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus)
            .source(source)
            .detail_type(&message.event_type)
            .detail(detail)
            .set_time(time)
            .build();
        let answer = self
            .client
            .put_events()
            .entries(entry)
            .send()
            .await
            .map_err(|err| sink_error("EventBridge PutEvents", &err, None))?;
        let result = answer.entries().first();
        let failed =
            answer.failed_entry_count() > 0 || result.is_some_and(|r| r.error_code().is_some());
        if !failed {
            let event_id = result.and_then(|r| r.event_id());
            return Ok(Delivered {
                status: None,
                note: event_id.map(|id| format!("event {id}")),
            });
        }
        let code = result
            .and_then(|r| r.error_code())
            .unwrap_or("unknown error");
        let detail = match result
            .and_then(|r| r.error_message())
            .filter(|m| !m.is_empty())
        {
            Some(text) => format!(
                "EventBridge PutEvents: entry failed ({code}): {}",
                short(text)
            ),
            None => format!("EventBridge PutEvents: entry failed ({code})"),
        };
        // The two retryable per-entry codes (PutEventsResultEntry docs).
        if matches!(code, "InternalFailure" | "ThrottlingException") {
            Err(SinkError::Retry {
                status: None,
                retry_after: None,
                detail,
            })
        } else {
            Err(SinkError::Permanent {
                status: None,
                detail,
            })
        }
    }
}

/// The options of kind `eventbridge`.
pub(crate) const EVENTBRIDGE_FIELDS: &[&str] = &["bus"];

/// The options of kind `eventbridge`: the bus (`default` unless named).
pub(crate) fn parse_eventbridge(f: &mut Fields) -> Option<EventBridgeDestination> {
    let bus = match f.string("bus") {
        None => "default".to_string(),
        Some((line, bus)) if bus.trim().is_empty() => {
            f.problem(
                line,
                "`bus` is empty (use \"default\" for the account's default bus)",
            );
            return None;
        }
        Some((_, bus)) => bus,
    };
    Some(EventBridgeDestination { bus })
}
