//! Destinations: how einmal's exactly-once decisions reach the user's own systems.
//!
//! The domain decides purely; the processor commits the decision; then a relay delivers
//! each matching event (and each domain output, such as the reference domain's customer
//! notifications) to every destination of its tenant whose filter matches, with a
//! stable key per event per destination ([`delivery_key`]). Delivery is at least once;
//! the key makes it exactly once at a destination that dedups on it (the Standard
//! Webhooks `webhook-id`, an SQS FIFO `MessageDeduplicationId`, the PostgreSQL sink's
//! `einmal_applied` table, which does it for the user in one transaction).
//!
//! This module is the port and its pure parts: the configuration ([`config`]), the
//! message a sink sends ([`Message`]), the sink port ([`Sink`]) and its error classes
//! ([`SinkError`]). Sinks that need a technology live with that technology: HTTP in
//! [`http`], PostgreSQL in `adapters::postgres`, SQS / EventBridge / Lambda in
//! `adapters::aws::sinks`. The relay that schedules, retries, orders and records
//! deliveries is `pipeline::relay`.

pub mod config;
pub(crate) mod fields;
pub mod filter;
pub mod http;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub use config::{DestinationConfig, DestinationKind};
pub use http::BodyFormat;

/// What one delivery sends, the same on every attempt and every replay (only the
/// attempt's timestamp differs). Built by the relay from an inbox item or a domain
/// output and the destination's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// [`delivery_key`]: one per event (or output) per destination. `webhook-id`,
    /// `Idempotency-Key`, `MessageDeduplicationId`, the `einmal_applied` key.
    pub key: String,
    /// The destination's configured name.
    pub destination: String,
    pub provider: String,
    pub tenant: String,
    /// The provider's event id (for an output: the id of the event that caused it).
    pub event_id: String,
    /// The provider's event type, or for a domain output its kind
    /// (e.g. `notification.payment_received`).
    pub event_type: String,
    pub object_id: Option<String>,
    pub object_version: Option<String>,
    /// When the provider says the event happened, Unix seconds.
    pub occurred_at: Option<i64>,
    /// The bytes to send: the verified original body, einmal's envelope
    /// ([`BodyFormat`]) or the output's JSON. Always UTF-8 JSON text for outputs and
    /// envelopes; an original body is sent exactly as the provider signed it.
    pub body: Vec<u8>,
    /// `application/json` unless the provider's body is something else (form posts).
    pub content_type: String,
}

/// A sink's answer to a successful call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Delivered {
    /// The destination's status where it has one (HTTP status, Lambda status code).
    pub status: Option<u16>,
    /// A short note for the delivery record (e.g. `duplicate` when a database sink
    /// found the key already applied, the SQS message id).
    pub note: Option<String>,
}

/// Why one delivery attempt failed, classified once, here: the relay's retry policy
/// follows from the variant, never from strings.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SinkError {
    /// Worth another attempt (network error, timeout, 5xx, 408/409/429, throttling, a
    /// function error, a failed commit). `retry_after` honours the destination's
    /// `Retry-After` when it sent one.
    #[error("retryable{}: {detail}", status_suffix(*.status))]
    Retry {
        status: Option<u16>,
        retry_after: Option<Duration>,
        /// Short and redacted: never the message body, never a secret.
        detail: String,
    },
    /// Will fail the same way every time (4xx other than 408/409/429, a refused
    /// address, a missing table): dead-letter the delivery at once.
    #[error("permanent{}: {detail}", status_suffix(*.status))]
    Permanent { status: Option<u16>, detail: String },
}

fn status_suffix(status: Option<u16>) -> String {
    status.map_or_else(String::new, |s| format!(" (status {s})"))
}

impl SinkError {
    pub fn status(&self) -> Option<u16> {
        match self {
            SinkError::Retry { status, .. } | SinkError::Permanent { status, .. } => *status,
        }
    }
}

/// One destination technology. A sink is built once per destination from its
/// configuration and shared by every delivery to it; `deliver` is time-bounded by the
/// sink (per-call timeout) and never panics on any answer.
#[async_trait]
pub trait Sink: Send + Sync {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError>;
}

/// The stable key of one event (or output) for one destination: `msg_` and 32 hex
/// digits of SHA-256 over destination, provider, tenant and the event's (or output's)
/// own key. The same on every retry and replay, different per destination (so one
/// destination's dedup never hides an event from another), free of `.` (Standard
/// Webhooks forbids it in the signed id) and of anything the sender controls verbatim.
pub fn delivery_key(destination: &str, provider: &str, tenant: &str, item_key: &str) -> String {
    hashed_key([destination, provider, tenant, item_key])
}

/// The delivery key of a domain output at `destination`: from the output's own key
/// (the effect that caused it, [`Output::key`]) and the tenant, never from the event
/// that (re-)ran the decision, so whichever provider's event finds the output again,
/// the destination sees one key. The scope part is no provider name, so an output's
/// key never equals an event's.
pub fn output_delivery_key(destination: &str, tenant: &str, output_key: &str) -> String {
    hashed_key([destination, OUTPUT_SCOPE, tenant, output_key])
}

/// Where an event key has its provider, an output key has this (not a provider name).
const OUTPUT_SCOPE: &str = "#output";

fn hashed_key(parts: [&str; 4]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    format!("msg_{}", hex::encode(&hash.finalize()[..16]))
}

/// A domain output: something the decision asks to tell the outside world (the
/// reference domain's customer notifications), recorded atomically with the decision
/// in the record it changed and delivered once per `key` through the destinations
/// whose `outputs` filter matches `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// Dot-separated, e.g. `notification.payment_received`.
    pub kind: String,
    /// Stable across re-decisions: the effect key that caused it (`dedup_key`).
    pub key: String,
    pub object_id: Option<String>,
    pub data: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_keys_are_stable_per_destination_and_dot_free() {
        let a = delivery_key("shop", "stripe", "demo", "evt_1.2");
        assert_eq!(a, delivery_key("shop", "stripe", "demo", "evt_1.2"));
        assert_ne!(a, delivery_key("crm", "stripe", "demo", "evt_1.2"));
        assert_ne!(a, delivery_key("shop", "stripe", "other", "evt_1.2"));
        // Length-prefixed parts: moving a separator changes the key.
        assert_ne!(
            delivery_key("ab", "c", "d", "e"),
            delivery_key("a", "bc", "d", "e")
        );
        assert!(a.starts_with("msg_") && a.len() == 36 && !a.contains('.'));
        // An output's key: per destination and tenant, never an event's key.
        let o = output_delivery_key("shop", "demo", "evt_1.2");
        assert!(o.starts_with("msg_") && o.len() == 36);
        assert_ne!(o, a);
        assert_ne!(o, output_delivery_key("shop", "other", "evt_1.2"));
    }
}
