//! The business domain port and the reference e-commerce domain.
//!
//! A [`Domain`] only decides: given an event and the current records it touches, it
//! returns the new records, each change tagged with an effect key derived from the
//! business identity (tenant + object + action + version / refund id / fulfillment id),
//! never from the delivery. The framework (`pipeline::process`) owns the guards: it
//! drops changes whose effect key is already applied, commits the rest atomically with
//! version conditions, and retries on conflicts. Users replace the domain; the guards stay.
//!
//! # No record grows with the events that touched it
//!
//! An effect key is recorded on the record that owns the effect (the event's subject,
//! e.g. the order). A change of a record that many events touch (a SKU, a counter, an
//! account balance) names that owner ([`Change::keyed_on`]): the framework records
//! the key on the owner, in the same atomic commit, and changes the shared record
//! under its version condition only. The shared record's size and write cost then stay
//! constant however many events touched it. A change keyed on its own record adds its
//! key there; a record whose `applied` set would grow past [`state::MAX_APPLIED_KEYS`]
//! fails the event permanently (a clear dead letter, not a record silently growing
//! toward DynamoDB's 400 KB item limit).
//!
//! # Reads are guarded too
//!
//! Every record a decision loaded and does not change is version-checked in the same
//! atomic commit, so a decision that depends on a record it only reads ("activate plan
//! X if plan Y is inactive") cannot commit on a stale read. A domain opts a read out
//! explicitly with [`Domain::guards_read`] when its decision does not depend on that
//! record staying unchanged (the reference domain's SKU reads: a SKU is written under
//! its version whenever the decision uses it).

pub mod payment_view;
pub mod reference;
pub mod state;

use std::any::Any;
use thiserror::Error;

use crate::destinations::Output;
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
    /// The record whose `applied` set records `effect_key`: `None` = this record
    /// (`key`). Set for a change of a record that many events touch: the key lives on
    /// the owner (which must be among the targets and is written in the same commit)
    /// and this record gets no key. The change is dropped when its key is already on
    /// either record, so several changes may share the owner's key (e.g. the stock
    /// moves of an order guarded by the order's creation).
    pub keyed_on: Option<StateKey>,
}

impl Change {
    /// A change whose effect key is recorded on the record it changes.
    pub fn new(key: StateKey, effect_key: impl Into<String>, data: serde_json::Value) -> Self {
        Change {
            key,
            effect_key: effect_key.into(),
            data,
            keyed_on: None,
        }
    }

    /// A change of a shared record (`key`) whose effect key is recorded on `owner`.
    pub fn keyed_on(
        key: StateKey,
        owner: StateKey,
        effect_key: impl Into<String>,
        data: serde_json::Value,
    ) -> Self {
        Change {
            key,
            effect_key: effect_key.into(),
            data,
            keyed_on: Some(owner),
        }
    }

    /// The record whose `applied` set holds this change's effect key.
    pub fn key_holder(&self) -> &StateKey {
        self.keyed_on.as_ref().unwrap_or(&self.key)
    }
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

/// An event as a domain prepared it ([`Domain::prepare`]): the records it targets and,
/// optionally, what the domain parsed from it, so that every decision on it (a
/// conflict decides again on new versions) reuses the parse.
pub struct Prepared {
    pub targets: Vec<StateKey>,
    parsed: Option<Box<dyn Any + Send + Sync>>,
}

impl Prepared {
    /// Targets alone: [`Domain::decide_prepared`] decides from the event.
    pub fn new(targets: Vec<StateKey>) -> Self {
        Prepared {
            targets,
            parsed: None,
        }
    }

    /// Targets and the domain's own parse of the event.
    pub fn with_parsed<T: Any + Send + Sync>(targets: Vec<StateKey>, parsed: T) -> Self {
        Prepared {
            targets,
            parsed: Some(Box::new(parsed)),
        }
    }

    /// The parse [`Prepared::with_parsed`] kept, if it is a `T`.
    pub fn parsed<T: Any>(&self) -> Option<&T> {
        self.parsed.as_ref()?.downcast_ref()
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("targets", &self.targets)
            .field("parsed", &self.parsed.is_some())
            .finish()
    }
}

pub trait Domain: Send + Sync {
    /// The records this event reads and may change. Empty = nothing to load
    /// (`decide` is then called with no records, typically to ignore the event).
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError>;

    /// The event prepared once per run: its targets, and what a domain that parses its
    /// events keeps for [`Domain::decide_prepared`]. Default: [`Domain::targets`].
    fn prepare(&self, event: &DomainEvent<'_>) -> Result<Prepared, DomainError> {
        Ok(Prepared::new(self.targets(event)?))
    }

    /// [`Domain::decide`] on a prepared event (the processor calls this one, once per
    /// round). Default: [`Domain::decide`].
    fn decide_prepared(
        &self,
        event: &DomainEvent<'_>,
        prepared: &Prepared,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        let _ = prepared;
        self.decide(event, current)
    }

    /// Decide given the current records, in the order `targets` returned them.
    /// Must be deterministic: a replay with the same records decides the same.
    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError>;

    /// Whether a loaded record that the decision leaves unchanged must still be at the
    /// loaded version when the changes commit (a version check in the same atomic
    /// commit; on DynamoDB a `ConditionCheck`, which costs write units like a
    /// transactional write of that item). Default: every read is guarded, so a
    /// decision never commits on a stale read. Return `false` only for a record whose
    /// unchanged value the decision does not depend on, typically a hot record that
    /// the decision writes whenever it uses it (a guard would make every event that
    /// reads it conflict with every event that writes it).
    fn guards_read(&self, _event: &DomainEvent<'_>, _record: &StateKey) -> bool {
        true
    }

    /// What the decision asks to tell the outside world (customer notifications, ...),
    /// delivered through the destinations whose `outputs` filter matches each kind,
    /// once per [`Output::key`]. Called with ALL changes of an applied decision (before
    /// the framework drops those already applied), so a re-run after a crash between
    /// commit and finish finds the same outputs. Must be deterministic. Default: none.
    fn outputs(&self, _event: &DomainEvent<'_>, _changes: &[Change]) -> Vec<Output> {
        Vec::new()
    }
}
