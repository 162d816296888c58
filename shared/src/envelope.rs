//! The envelope: what every provider's webhook is reduced to after verification.

use serde::{Deserialize, Serialize};

/// Provider-neutral facts about one event, extracted after the signature was verified.
///
/// `event_id` is the provider's *event* id, stable across retries (never a
/// per-attempt delivery id); together with provider and tenant it is the dedup key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub provider: String,
    pub tenant: String,
    pub event_id: String,
    pub event_type: String,
    /// The business object the event is about (payment intent, order, ...).
    pub object_id: Option<String>,
    /// A version of that object when the provider sends one (e.g. Shopify `updated_at`).
    pub object_version: Option<String>,
    /// When the provider says the event happened, Unix seconds.
    pub occurred_at: Option<i64>,
    /// The per-attempt delivery id, for logs only (never for dedup).
    pub delivery_id: Option<String>,
}

impl Envelope {
    pub fn key(&self) -> InboxKey {
        InboxKey::new(&self.provider, &self.tenant, &self.event_id)
    }
}

/// The inbox primary key: `provider#tenant#event_id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InboxKey(String);

impl InboxKey {
    pub fn new(provider: &str, tenant: &str, event_id: &str) -> Self {
        InboxKey(format!("{provider}#{tenant}#{event_id}"))
    }

    /// Rebuild a key from its stored string form (no validation beyond non-empty parts).
    pub fn from_stored(pk: impl Into<String>) -> Self {
        InboxKey(pk.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InboxKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
