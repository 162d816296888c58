//! The business domain port and the reference e-commerce domain.
//!
//! A [`Domain`] only decides: given an event and the current records it touches, it
//! returns the new records, each change tagged with an effect key derived from the
//! business identity (tenant + object + action + version / refund id / fulfillment id),
//! never from the delivery. The framework (`pipeline::process`) owns the guards: it
//! drops changes whose effect key is already applied, commits the rest atomically with
//! version conditions, and retries on conflicts. Users replace the domain; the guards stay.

pub mod reference;
pub mod state;

use thiserror::Error;

use crate::envelope::Envelope;
use state::{StateKey, StateRecord};

/// What the domain sees of one event: the envelope and the verified raw body.
#[derive(Debug, Clone, Copy)]
pub struct DomainEvent<'a> {
    pub envelope: &'a Envelope,
    pub body: &'a [u8],
}

/// One record change guarded by `effect_key`. `data` replaces the record's data.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: StateKey,
    pub effect_key: String,
    pub data: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Apply these changes atomically (each only if its effect key is new on its record).
    Apply {
        changes: Vec<Change>,
        result: String,
    },
    /// Nothing to do, with the reason recorded on the inbox item (unsupported type,
    /// superseded by a newer state, a transition that is not allowed, ...).
    Ignore { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    /// Will never succeed as is (schema invalid, unknown SKU, business rule): dead letter now.
    #[error("permanent: {0}")]
    Permanent(String),
    /// A prerequisite is missing (a refund before its payment, a fulfillment before its
    /// order): retry later so the final state does not depend on arrival order.
    #[error("waiting: {0}")]
    Wait(String),
}

pub trait Domain: Send + Sync {
    /// The records this event reads and may change. Empty = nothing to load
    /// (`decide` is then called with no records, typically to ignore the event).
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError>;

    /// Decide given the current records, in the order `targets` returned them.
    /// Must be deterministic: a replay with the same records decides the same.
    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError>;
}
