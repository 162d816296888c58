//! Storage ports: the only way the pipeline touches durable state.
//!
//! Two adapters implement them: `adapters::aws` (DynamoDB + SQS) and
//! `adapters::embedded` (one SQLite file). The conformance suite in `tests/`
//! runs the same scenarios against both.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::envelope::{Envelope, InboxKey};
pub use crate::providers::paypal::CertificateCache;
use crate::providers::{self, Provider};
pub use crate::store_error::StoreError;

/// Where an inbox item is in the pipeline.
///
/// `received -> queued -> processing -> completed | ignored | retryable -> ... | dead_letter`,
/// and `processing -> waiting -> processing` while a prerequisite is missing (see
/// [`Waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    Received,
    Queued,
    Processing,
    Completed,
    Ignored,
    Retryable,
    /// Parked until a prerequisite record commits ([`Waiting`]): no queue message,
    /// no retry budget spent.
    Waiting,
    DeadLetter,
}

impl InboxState {
    pub const ALL: [InboxState; 8] = [
        InboxState::Received,
        InboxState::Queued,
        InboxState::Processing,
        InboxState::Completed,
        InboxState::Ignored,
        InboxState::Retryable,
        InboxState::Waiting,
        InboxState::DeadLetter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InboxState::Received => "received",
            InboxState::Queued => "queued",
            InboxState::Processing => "processing",
            InboxState::Completed => "completed",
            InboxState::Ignored => "ignored",
            InboxState::Retryable => "retryable",
            InboxState::Waiting => "waiting",
            InboxState::DeadLetter => "dead_letter",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// `completed`, `ignored` and `dead_letter`: processing is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            InboxState::Completed | InboxState::Ignored | InboxState::DeadLetter
        )
    }
}

impl std::fmt::Display for InboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an item entered the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Webhook,
    Reconcile,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Webhook => "webhook",
            Source::Reconcile => "reconcile",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "webhook" => Some(Source::Webhook),
            "reconcile" => Some(Source::Reconcile),
            _ => None,
        }
    }
}

/// One stored event. The body is kept compressed (`crate::body`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxItem {
    pub key: InboxKey,
    pub envelope: Envelope,
    pub state: InboxState,
    pub source: Source,
    /// Processing attempts so far.
    pub attempts: u32,
    pub received_at_ms: i64,
    pub updated_at_ms: i64,
    /// Retention: Unix seconds after which the store may delete the item (DynamoDB TTL).
    pub expires_at: i64,
    /// Set when the receiver knows its queue send failed; the next duplicate re-enqueues.
    pub enqueue_failed: bool,
    /// Last error message, when processing failed (kept after a later success, so
    /// support can tell why an event needed several attempts).
    pub last_error: Option<String>,
    /// Class of the last error: `"transient"` or `"permanent"`.
    pub last_error_class: Option<String>,
    /// While `processing`: the lease end (Unix ms) and the worker holding it. A lease
    /// that has run out means the worker died; another may claim the item.
    pub lease_until_ms: Option<i64>,
    pub lease_owner: Option<String>,
    /// What processing produced: a result reference, or why the event was ignored.
    pub result: Option<String>,
    pub body_encoding: String,
    /// Size of the raw body before compression.
    pub body_len: u64,
    #[serde(skip)]
    pub body: Vec<u8>,
    /// Set while the event waits for a prerequisite (state `waiting`, and while a
    /// woken waiter is being processed again); cleared when it leaves waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// What the relay did with the event: one entry per matching destination and per
    /// domain output ([`DeliveryStatus`]), written by the processor's finish and then
    /// by the relay's retries ([`InboxRelay::finish_relay`]). Empty when nothing matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<DeliveryStatus>,
    /// The earliest next attempt of a pending delivery (Unix ms); `None` when nothing
    /// is pending. Indexed (sparse): [`InboxRelay::relay_due`] reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_due_ms: Option<i64>,
}

/// What a parked event waits for. The reason (the domain's `Wait` message) is in
/// [`InboxItem::last_error`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// The state record whose commit wakes the event: the first of the records the
    /// domain targeted ([`crate::domain::Domain::targets`]), or [`NO_RECORD`].
    pub on: String,
    /// When the event first parked (Unix ms); kept across wakes that park it again,
    /// so the wait window counts from here.
    pub since_ms: i64,
}

/// [`Waiting::on`] of an event that targeted no record: only the sweeper's periodic
/// re-check wakes it.
pub const NO_RECORD: &str = "-";

/// How a [`Finish`] changes the item's [`Waiting`] marker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WaitChange {
    /// Leave it as it is (the item never waited).
    #[default]
    Keep,
    /// Park (state `waiting`): set the marker (and its index entry).
    Park(Waiting),
    /// The item waited and now moves on: remove the marker (and its index entry).
    Clear,
}

/// The result of a conditional insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Inserted,
    /// The key existed; the stored item comes back in the same call
    /// (DynamoDB `ReturnValuesOnConditionCheckFailure=ALL_OLD`), without its body where
    /// the store keeps bodies in items of their own (DynamoDB).
    Duplicate(Box<InboxItem>),
    /// The key existed but its body was missing (its first request died or failed
    /// between the event's put and the body's, so it was never acknowledged): this
    /// put stored the body (one conditional write) and, for a `dead_letter` item,
    /// moved it back to `queued`. The item as it is now, without its body where the
    /// store keeps bodies apart; the caller enqueues its pointer like a new event's.
    Restored(Box<InboxItem>),
}

/// The start of every reason that says an event's body is not stored
/// ([`ClaimOutcome::BodyMissing`]): the processor's and the sweeper's dead letters
/// say so, and a later duplicate that stores the body takes such an item back.
pub const BODY_MISSING: &str = "body missing";

/// Whether a duplicate of an item in `state` must check that the body is stored
/// ([`PutOutcome::Restored`]): every state but `completed` and `ignored` (their
/// processing read the body, so it was there).
pub fn may_lack_body(state: InboxState) -> bool {
    !matches!(state, InboxState::Completed | InboxState::Ignored)
}

#[derive(Debug, Clone, Default)]
pub struct InboxFilter {
    pub state: Option<InboxState>,
    pub provider: Option<String>,
    pub tenant: Option<String>,
    pub limit: usize,
}

/// An event search ([`Inbox::search`]): the [`InboxFilter`] scope plus type, object,
/// time range and a cursor. `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct InboxQuery {
    /// State, provider, tenant and the page size (`limit` 0 = the store's default).
    pub filter: InboxFilter,
    pub event_type: Option<String>,
    pub object_id: Option<String>,
    /// Received at or after (Unix ms).
    pub since_ms: Option<i64>,
    /// Received before (Unix ms).
    pub until_ms: Option<i64>,
    /// Where the previous page stopped ([`InboxPage::next_cursor`]); `None` = the start.
    pub cursor: Option<String>,
}

/// One page of a search. The order is the store's own and stable across pages:
/// newest first on the embedded store, the table's key order on DynamoDB.
#[derive(Debug, Clone, Default)]
pub struct InboxPage {
    pub items: Vec<InboxItem>,
    /// Opaque; `Some` while more items may follow (a page may be short, even empty,
    /// when a store bounds the work one page may do).
    pub next_cursor: Option<String>,
}

/// How many items of a scope are in each state ([`Inbox::count_states`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Every state of [`InboxState::ALL`], zeros included.
    pub counts: Vec<(InboxState, u64)>,
    /// The store stopped at its bound before the end: the counts are lower bounds.
    pub truncated: bool,
}

/// Why a search failed: the caller's cursor (a client error), or the store.
#[derive(Debug, Error)]
pub enum SearchError {
    /// A cursor this store did not hand out: from another store, cut, or made up.
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Error classes stored in [`InboxItem::last_error_class`].
pub const ERROR_CLASS_TRANSIENT: &str = "transient";
pub const ERROR_CLASS_PERMANENT: &str = "permanent";

#[derive(Debug, Error)]
pub enum QueueError {
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    #[error("queue message is malformed: {0}")]
    Malformed(String),
}

/// The inbox: one item per provider + tenant + event id.
#[async_trait]
pub trait Inbox: Send + Sync {
    /// Insert only if no item with this key exists (one conditional write).
    async fn put_new(&self, item: &InboxItem) -> Result<PutOutcome, StoreError>;
    /// Strongly consistent read.
    async fn get(&self, key: &InboxKey) -> Result<Option<InboxItem>, StoreError>;
    /// Operator listing, newest first.
    async fn list(&self, filter: &InboxFilter) -> Result<Vec<InboxItem>, StoreError>;
    /// Operator search: one page of the items `query` matches (see [`InboxPage`]).
    /// A cursor this store did not hand out is [`SearchError::InvalidCursor`].
    async fn search(&self, query: &InboxQuery) -> Result<InboxPage, SearchError>;
    /// Items per state within `filter`'s provider and tenant (its state and limit
    /// are ignored).
    async fn count_states(&self, filter: &InboxFilter) -> Result<StateCounts, StoreError>;
    /// Record that the receiver's queue send failed, so the next duplicate re-enqueues
    /// at once. Only applies while the item is still `received`.
    async fn mark_enqueue_failed(&self, key: &InboxKey) -> Result<(), StoreError>;
}

/// Whether [`InboxHints`] finds the hints of `provider`: the thin-event providers
/// without a list API (GoPay, Klarna push; [`HintSpec::indexed`]).
///
/// [`HintSpec::indexed`]: crate::providers::thin::HintSpec::indexed
pub fn has_indexed_hints(provider: &dyn Provider) -> bool {
    provider.hint().is_some_and(|hint| hint.indexed)
}

/// The names of the providers whose hints [`InboxHints`] finds.
pub fn indexed_hint_providers() -> impl Iterator<Item = &'static str> {
    providers::all()
        .iter()
        .filter(|p| has_indexed_hints(**p))
        .map(|p| p.name())
}

/// The hint scope of an item: `{provider}#{tenant}` for a hint (`hint.*` event type,
/// see `providers::thin`) of a provider with indexed hints, `None` for every other
/// item. Fixed at put time (provider, tenant and event type never change), so only
/// the put writes the index.
pub fn hint_scope(envelope: &Envelope) -> Option<String> {
    (providers::lookup(&envelope.provider).is_some_and(has_indexed_hints)
        && envelope
            .event_type
            .starts_with(crate::providers::thin::HINT_PREFIX))
    .then(|| hint_scope_of(&envelope.provider, &envelope.tenant))
}

/// The hint scope value for `provider` and `tenant` (see [`hint_scope`]).
pub fn hint_scope_of(provider: &str, tenant: &str) -> String {
    format!("{provider}#{tenant}")
}

/// What reconciliation needs of one hint item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxHint {
    pub key: InboxKey,
    /// The resource the hint named (payment / order id).
    pub object_id: String,
    pub state: InboxState,
    pub received_at_ms: i64,
}

/// The hint items of the thin providers without a list API, found through an index
/// that holds only them (a sparse GSI on DynamoDB, a partial index on SQLite), never
/// by a table scan.
#[async_trait]
pub trait InboxHints: Send + Sync {
    /// Up to `limit` hints of `provider` + `tenant` received at or after `since_ms`,
    /// oldest first (ties by key). Empty for a provider without indexed hints
    /// ([`indexed_hint_providers`]): its items are not indexed. A result of exactly
    /// `limit` hints may have more behind it.
    async fn hints_since(
        &self,
        provider: &str,
        tenant: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<InboxHint>, StoreError>;
}

/// Why a [`InboxProcessing::claim`] did not hand out the item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Now `processing` with our lease; `attempts` already counts this attempt. The
    /// item comes back whole (body included) from the same call.
    Claimed(Box<InboxItem>),
    /// Already `completed`, `ignored` or `dead_letter`: nothing to do (a duplicate message).
    Finished(InboxState),
    /// Another worker holds a live lease until this time (Unix ms).
    Leased { until_ms: i64 },
    /// No such item (expired by TTL, or never stored).
    Missing,
    /// The item is there to be processed, but its body is not stored (see
    /// [`PutOutcome::Restored`]): a transient failure until the provider's retry
    /// stores it. The item comes back without a body and, like a claim, counts the
    /// attempt (under the lease, where the store claims).
    BodyMissing(Box<InboxItem>),
}

/// An inbox item as a reader saw it: its state and last update (every state change
/// stamps `updated_at_ms`). A write that must not undo a change made since (another
/// run's finish, a replay, the sweeper's marking) is conditioned on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemVersion {
    pub state: InboxState,
    pub updated_at_ms: i64,
}

impl ItemVersion {
    pub fn of(item: &InboxItem) -> Self {
        ItemVersion {
            state: item.state,
            updated_at_ms: item.updated_at_ms,
        }
    }
}

/// How [`InboxProcessing::begin`] handed a run its item, which decides what its
/// [`InboxProcessing::finish`] is conditioned on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handout {
    /// Claimed under this owner's lease (the claim counted the attempt).
    Leased { owner: String },
    /// Handed out without a lease, with its attempt count and the item as the run read
    /// it.
    Unleased { attempts: u32, seen: ItemVersion },
}

impl Handout {
    pub fn leased(owner: &str) -> Self {
        Handout::Leased {
            owner: owner.to_string(),
        }
    }

    /// What `worker`'s run of `item` (as `begin` returned it) holds: a lease when the
    /// claim names it.
    pub fn of(item: &InboxItem, worker: &str) -> Self {
        if item.lease_owner.as_deref() == Some(worker) {
            Handout::Leased {
                owner: worker.to_string(),
            }
        } else {
            Handout::Unleased {
                attempts: item.attempts,
                seen: ItemVersion::of(item),
            }
        }
    }
}

/// The end of one processing attempt, written by [`InboxProcessing::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// `completed`, `ignored`, `dead_letter`, `retryable` or `waiting`.
    pub state: InboxState,
    /// `Some` overwrites the stored value; `None` leaves it as it is. A `completed` or
    /// `ignored` finish clears both error fields ([`Finish::clears_error`]): an event
    /// that once failed (dead-lettered, then replayed) and completed keeps no error.
    pub error_class: Option<String>,
    /// As `error_class`.
    pub error: Option<String>,
    /// `Some` overwrites the stored value; `None` leaves it as it is.
    pub result: Option<String>,
    pub now_ms: i64,
    /// [`WaitChange::Park`] exactly when `state` is `waiting`.
    pub wait: WaitChange,
    /// `Some` overwrites the stored deliveries and [`InboxItem::relay_due_ms`] (with
    /// `relay_due_ms` below, `None` = nothing pending); `None` leaves both as they are.
    /// Set by the processor after delivering a `completed` / `ignored` event, so the
    /// delivery record costs no write of its own.
    pub deliveries: Option<Vec<DeliveryStatus>>,
    /// Written only with `deliveries`: the earliest next attempt of a pending one.
    pub relay_due_ms: Option<i64>,
}

impl Finish {
    /// Whether this finish removes the stored error (`completed`, `ignored`).
    pub fn clears_error(&self) -> bool {
        matches!(self.state, InboxState::Completed | InboxState::Ignored)
    }
}

/// The processor's side of the inbox: claim an item under a lease, finish it (each one
/// conditional write), and find the items waiting on a record (one index query).
#[async_trait]
pub trait InboxProcessing: Send + Sync {
    /// Conditional update to `processing` with a lease until `now_ms + lease_ms`,
    /// `attempts += 1`. Allowed from `received`, `queued`, `retryable`, `waiting`, or
    /// `processing` whose lease has run out (a crashed worker). Returns the claimed item with its
    /// body in the same call; otherwise says why not (from the same call too).
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Start the attempt of one delivery. A store that leases (the embedded one) claims
    /// its item ([`InboxProcessing::claim`]). A store may instead hand the item out
    /// without a lease (DynamoDB: from the message that carried it, [`Delivery::item`],
    /// or one read for a pointer): the queue's visibility timeout then stands in for
    /// the lease, and business commits are guarded by versions and effect keys either
    /// way. [`Handout::of`] says which the run got. `attempts` counts this attempt.
    async fn begin(
        &self,
        delivery: &Delivery,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Set the final or retry state, error class and message, result, `updated_at_ms`,
    /// and release the lease, only while the run still holds the item (else
    /// `Ok(false)`):
    /// - [`Handout::Leased`]: while still `processing` and leased by that owner;
    /// - [`Handout::Unleased`]: while the item is still as the run read it (`seen`:
    ///   another run finished or parked it, a replay queued it, a worker claimed it),
    ///   or when the sweeper's [`mark_dead_letter`] marked exactly that version
    ///   meanwhile (this run was committing it); `attempts` set to the count `begin`
    ///   handed out. So a stale run never overwrites a newer state (a `waiting` with
    ///   `retryable`, leaving the item in neither of the sweeper's indexes). A store
    ///   whose `begin` always claims refuses it ([`StoreError::Rejected`]).
    ///
    /// [`mark_dead_letter`]: InboxProcessing::mark_dead_letter
    async fn finish(
        &self,
        key: &InboxKey,
        run: &Handout,
        finish: &Finish,
    ) -> Result<bool, StoreError>;

    /// Redrive bookkeeping: mark the item `dead_letter` with `reason`, only while it is
    /// still as the caller read it (`seen`: not terminal, nothing changed since) and no
    /// live lease holds it (that worker finishes it). `Ok(false)` when it did not
    /// apply (a missing item included). A run without a lease that began from that
    /// same version may still finish over the mark ([`Handout::Unleased`]).
    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        seen: ItemVersion,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Up to `limit` items parked on the state record `record_pk` ([`Waiting::on`]),
    /// found through an index of waiters (never a scan). Called after a commit wrote
    /// that record, to wake them. May include items already woken (harmless: their
    /// claim decides).
    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError>;
}

/// Where one delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// The destination accepted it.
    Delivered,
    /// Not yet delivered: the relay tries again at [`DeliveryStatus::next_attempt_ms`].
    Pending,
    /// Given up (a permanent answer, or attempts / age exhausted): `einmal replay`
    /// schedules it again with the same key.
    DeadLetter,
    /// An ordered destination already has a newer version of the object: never sent.
    Superseded,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Delivered => "delivered",
            DeliveryState::Pending => "pending",
            DeliveryState::DeadLetter => "dead_letter",
            DeliveryState::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One delivery of an event (or of a domain output) to one destination, as recorded on
/// the inbox item. Keeps only the last attempt and a count, so its size is bounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryStatus {
    /// The destination's configured name.
    pub destination: String,
    /// [`crate::destinations::delivery_key`]: the same on every attempt and replay.
    pub key: String,
    pub state: DeliveryState,
    /// Attempts made (0 while an ordered delivery waits for its turn).
    pub attempts: u32,
    /// The last attempt's status, where the destination has one (HTTP status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_latency_ms: Option<u64>,
    /// When the last attempt started (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<i64>,
    /// While `pending`: when the relay tries again (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<i64>,
    /// A short, redacted note: the error, an excerpt of the answer, why superseded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For a domain output: the output itself, so a retry rebuilds the same message
    /// without running the domain again. `None` for the event's own delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<crate::destinations::Output>,
    /// An ordered delivery that ended (delivered, dead-lettered) but whose object turn
    /// the store did not take back yet: the relay releases it when `next_attempt_ms`
    /// is due ([`InboxRelay::order_release`]); until then it holds its object.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_owed: bool,
}

/// The index key of an item with dead-lettered deliveries ([`InboxRelay::relay_dead`]):
/// the latest last attempt among them (`now_ms` for one never attempted, e.g. its
/// destination left the configuration); `None` when no delivery is dead-lettered (the
/// item is not indexed). The writers of the deliveries store it with them.
pub fn dead_lettered_at(deliveries: &[DeliveryStatus], now_ms: i64) -> Option<i64> {
    deliveries
        .iter()
        .filter(|d| d.state == DeliveryState::DeadLetter)
        .map(|d| d.last_attempt_ms.unwrap_or(now_ms))
        .max()
}

/// The position of an event in its object's order ([`InboxRelay::order_acquire`],
/// rules in [`crate::order`]): queued events go lowest first — `at` (the object version
/// as a number or an RFC 3339 time in ms, else `occurred_at` in ms, else the receipt),
/// ties in arrival order (`received_ms`), then by event id. Only `version` (the
/// provider's own) can make an event superseded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OrderPosition {
    pub at: i64,
    /// When the event was received (Unix ms); 0 on cursors written before it was kept.
    #[serde(default)]
    pub received_ms: i64,
    pub event_id: String,
    /// The provider's object version (ms or a sequence number), where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
}

/// One ordered delivery asking for its object's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderClaim {
    /// The cursor: one per destination and object ([`order_cursor_id`]).
    pub cursor: String,
    /// The delivery key asking.
    pub key: String,
    /// The attempt asking (unique per attempt): one run holds the turn, so two runs of
    /// one event never both send.
    pub run: String,
    /// The inbox item it delivers (handed on by [`InboxRelay::order_release`]).
    pub item: InboxKey,
    pub position: OrderPosition,
    /// The first event to queue on an idle object opens a window of this length
    /// before anything is sent, so a shuffled burst is delivered fully in order.
    pub window_ms: i64,
    /// How long a `Go` holds the object at most (above the sink's timeout): a run
    /// that dies holding it stops holding it then.
    pub hold_ms: i64,
    /// Queue entries older than this (Unix ms) are dropped as abandoned (their item
    /// expired, their destination's age budget is long over): a lost entry never
    /// holds its object forever.
    pub stale_before_ms: i64,
    /// The claiming item's expiry (Unix seconds): a store that expires cursors keeps
    /// this one at least that long, so no event outlives its object's cursor.
    pub retain_until_secs: i64,
}

/// How an ordered delivery ended its turn ([`InboxRelay::order_release`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Delivered: the position is raised to it.
    Delivered(OrderPosition),
    /// Dead-lettered: it leaves the queue without raising the position.
    Failed,
    /// Failed, retried later: it keeps its place at the head, the hold is freed.
    Retrying,
}

/// One run ending its turn on a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRelease {
    pub cursor: String,
    pub key: String,
    pub run: String,
    pub outcome: ReleaseOutcome,
}

/// What [`InboxRelay::order_acquire`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderGate {
    /// This key holds the object: deliver now, then [`InboxRelay::order_release`].
    Go,
    /// Never send it: the destination has a strictly newer version (`delivered` is
    /// what it has), or this is the event it got last (`delivered` is the claim's own
    /// position: it went out before).
    Superseded { delivered: OrderPosition },
    /// Not yet: the window is open or an older event of the object goes first. Try
    /// again at `until_ms` (the holder's release also hands the turn on at once).
    Wait { until_ms: i64 },
}

/// Entries one order cursor queues at most (pending events of one object at one
/// destination); beyond it new events wait outside the queue and retry.
pub const MAX_ORDER_QUEUE: usize = 64;

/// The cursor id of `destination` and one object (provider + tenant + object id).
pub fn order_cursor_id(destination: &str, provider: &str, tenant: &str, object_id: &str) -> String {
    format!("{destination}#{provider}#{tenant}#{object_id}")
}

/// The relay's side of the inbox: the items with pending deliveries, found through a
/// sparse index on [`InboxItem::relay_due_ms`] (never a scan), a short relay lease per
/// item (independent of the processing lease), and the per-object order cursors of
/// ordered destinations.
#[async_trait]
pub trait InboxRelay: Send + Sync {
    /// Up to `limit` items whose `relay_due_ms <= now_ms`, earliest first.
    async fn relay_due(&self, now_ms: i64, limit: usize) -> Result<Vec<InboxKey>, StoreError>;

    /// Up to `limit` items with a pending delivery (`relay_due_ms` set), earliest due
    /// first, bodies not loaded: the backlog metrics read their deliveries.
    async fn relay_pending(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError>;

    /// Up to `limit` items with a dead-lettered delivery, most recently dead-lettered
    /// first ([`dead_lettered_at`]), bodies not loaded, found through a sparse index of
    /// their own (never a scan): the operator's views (`einmal dlq list`, the console)
    /// and the dead-letter gauges. The processor's finish and
    /// [`InboxRelay::finish_relay`] keep the index in step with the deliveries they
    /// write, so a replayed delivery leaves it and a new dead letter enters it.
    async fn relay_dead(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError>;

    /// One conditional write: take the relay lease (until `now_ms + lease_ms`) if no
    /// live relay lease holds the item and the item is `completed` or `ignored`.
    /// Returns the item with its body, or `None` (missing, not finished, leased). Does
    /// not require the item to be due (replay re-schedules through it).
    async fn claim_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<InboxItem>, StoreError>;

    /// Only while `owner` holds the relay lease (else `Ok(false)`): overwrite the
    /// deliveries and `relay_due_ms` (its index entry), release the lease.
    async fn finish_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        deliveries: &[DeliveryStatus],
        relay_due_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// One atomic step on the claim's cursor ([`crate::order::Cursor::acquire`]):
    /// `Superseded` when the claim's version is strictly older than the newest the
    /// destination has (or it is the event delivered last); otherwise queue the key
    /// (once; the first on an idle object opens the window) and `Go` when it heads the
    /// queue, the window is over and no other run holds the object, else `Wait`. The
    /// same run asking again gets the same answer.
    async fn order_acquire(&self, claim: &OrderClaim, now_ms: i64)
        -> Result<OrderGate, StoreError>;

    /// End a run's turn ([`crate::order::Cursor::release`]). Returns the inbox item
    /// now heading the queue when nobody holds the object, so the relay can hand the
    /// turn on at once. A missing key or cursor is not an error.
    async fn order_release(
        &self,
        release: &OrderRelease,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError>;
}

/// What [`InboxSweep::waiting`] saw of the parked items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitingScan {
    /// Items in state `waiting` seen by this pass (capped by its read bound).
    pub count: usize,
    /// The earliest [`Waiting::since_ms`] among them.
    pub oldest_since_ms: Option<i64>,
    /// Up to `limit` parked items last touched before `due_before_ms`, least recently
    /// touched first: the sweeper re-sends their pointers. (On DynamoDB also woken
    /// waiters whose worker died: they are in no other index the sweeper reads.)
    pub due: Vec<InboxKey>,
}

/// The pointer message: the key of the inbox item. (The receiver's message for a new
/// item may carry the item and its body as well, [`Queue::send_item`].)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMessage {
    pub pk: InboxKey,
}

/// A received message with its handle for ack / visibility changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message: QueueMessage,
    pub receipt: String,
    /// How many times this message has been received, this time included.
    pub receive_count: u32,
    /// The item the message carried ([`Queue::send_item`]; body included), as it was
    /// when sent: [`InboxProcessing::begin`] of a store whose queue carries items hands
    /// it out without a read. `None` for a pointer alone.
    pub item: Option<Box<InboxItem>>,
    /// How often this event's message was postponed before ([`Queue::postpone`]): the
    /// retry number of an attempt whose inbox item cannot be read.
    pub postponed: u32,
}

/// The work queue: SQS semantics (visibility timeout, receive count, redrive to a DLQ).
#[async_trait]
pub trait Queue: Send + Sync {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError>;
    /// [`Queue::send`] carrying the sender's X-Ray trace header (SQS: the message
    /// system attribute `AWSTraceHeader`), so the processor can log the same trace id.
    /// Queues without trace propagation send the message alone.
    async fn send_traced(
        &self,
        message: &QueueMessage,
        trace_header: Option<&str>,
    ) -> Result<(), QueueError> {
        let _ = trace_header;
        self.send(message).await
    }
    /// The receiver's send of a newly stored item: a queue that can carry the item
    /// (SQS: the item and its compressed body in the message, while it fits) does, so
    /// the processor starts without reading the inbox ([`Delivery::item`]); the default
    /// sends the pointer alone.
    async fn send_item(
        &self,
        item: &InboxItem,
        trace_header: Option<&str>,
    ) -> Result<(), QueueError> {
        let message = QueueMessage {
            pk: item.key.clone(),
        };
        self.send_traced(&message, trace_header).await
    }
    /// Up to `max` visible messages; each becomes invisible for `visibility`.
    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError>;
    /// Delete a message after it was handled.
    async fn ack(&self, receipt: &str) -> Result<(), QueueError>;
    /// [`Queue::ack`] for several messages at once (a handled batch). Default: one
    /// `ack` after the other; every receipt is tried, the first error is returned.
    async fn ack_batch(&self, receipts: &[String]) -> Result<(), QueueError> {
        let mut first = Ok(());
        for receipt in receipts {
            if let Err(e) = self.ack(receipt).await {
                first = first.and(Err(e));
            }
        }
        first
    }
    /// Make a received message visible again after `visibility` (0 = now).
    async fn change_visibility(
        &self,
        receipt: &str,
        visibility: Duration,
    ) -> Result<(), QueueError>;
    /// Replace a received message by one that becomes visible after `delay` and starts
    /// again at receive count 0, carrying `delivery.postponed + 1`: a transient failure
    /// waits without spending the redrive's `maxReceiveCount`, which stays the
    /// backstop for a message whose handler crashes every time. SQS: SendMessage with
    /// `DelaySeconds` (at most 15 minutes) and DeleteMessage; the embedded queue: one
    /// update of the row. A stale receipt may leave a second message of the event,
    /// which the processor handles like any duplicate.
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> Result<(), QueueError>;
    /// Put a message straight into the dead-letter queue (a permanent failure does not
    /// wait for `maxReceiveCount` receives). SQS has no move: the caller sends the
    /// pointer here, then deletes the original.
    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError>;
    /// Up to `max` messages from the dead-letter queue (received, not deleted).
    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError>;
}

/// The sweeper's view of the inbox: items that should have moved on by now, found
/// through an index (a sparse GSI on DynamoDB, `(state, updated_at_ms)` on SQLite),
/// never by a table scan.
#[async_trait]
/// The sweeper also leaves dead letters in place ([`DeadLetterQueue::release_dead_letter`]).
pub trait InboxSweep: DeadLetterQueue + Send + Sync {
    /// Up to `limit` items, oldest `updated_at_ms` first: `received`, `queued` or
    /// `retryable` items last updated before `older_than_ms`, and `processing` items whose lease
    /// ran out before `older_than_ms` (a crashed worker).
    async fn stuck(&self, older_than_ms: i64, limit: usize) -> Result<Vec<InboxItem>, StoreError>;

    /// One pass over the parked items, through the waiters' index: at most
    /// `read_max` index entries, going on from where the last pass stopped, so every
    /// parked item comes up within a few passes however many there are (DynamoDB: a
    /// cursor item in the inbox table; SQLite: the index's order, least recently
    /// touched first, and a re-sent item is touched again by its re-run). Their count
    /// and oldest wait, and up to `limit` whose last update is before `due_before_ms`.
    async fn waiting(
        &self,
        due_before_ms: i64,
        limit: usize,
        read_max: usize,
    ) -> Result<WaitingScan, StoreError>;
}

/// The default bound of index entries one [`InboxSweep::waiting`] pass reads
/// (`EINMAL_SWEEP_WAITING_READ_MAX`); beyond it the count is of the entries read.
pub const WAITING_SCAN_MAX: usize = 10_000;

/// What [`InboxReplay::requeue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeueOutcome {
    /// Now `queued` (from this state); the caller sends the pointer.
    Requeued { from: InboxState },
    /// `completed` or `ignored` and not forced: left as it is.
    AlreadyDone(InboxState),
    /// A worker holds a live lease: it will finish the item.
    Busy { until_ms: i64 },
    /// No such item.
    Missing,
}

/// Operator replay: put an inbox item back to `queued` so the processor claims it
/// again (the processor's effect keys still prevent a repeated effect).
#[async_trait]
pub trait InboxReplay: Send + Sync {
    /// One conditional write. `dead_letter`, `retryable`, `received`, `queued` and
    /// `processing` with an expired lease become `queued` (attempts and last error
    /// kept); `completed` / `ignored` only when `force` (its result kept: a re-run that
    /// finds every effect applied leaves it as it is).
    async fn requeue(
        &self,
        key: &InboxKey,
        force: bool,
        now_ms: i64,
    ) -> Result<RequeueOutcome, StoreError>;
}

/// Removing (or releasing) messages received with
/// [`Queue::receive_dead_letters`]: SQS has no move, replay re-sends the pointer to
/// the main queue, then deletes the dead letter.
#[async_trait]
pub trait DeadLetterQueue: Send + Sync {
    async fn delete_dead_letter(&self, receipt: &str) -> Result<(), QueueError>;
    /// Make a received dead letter visible again at once.
    async fn release_dead_letter(&self, receipt: &str) -> Result<(), QueueError>;
}

/// Every inbox port at once: what one backend's store (DynamoDB + SQS, or SQLite)
/// implements, so wiring passes one store instead of the same one once per port. The
/// fine-grained ports stay for code (and fault-injecting tests) that needs only one.
pub trait InboxStore:
    Inbox
    + InboxHints
    + InboxProcessing
    + Queue
    + InboxSweep
    + InboxReplay
    + InboxRelay
    + DeadLetterQueue
{
}

impl<T> InboxStore for T where
    T: Inbox
        + InboxHints
        + InboxProcessing
        + Queue
        + InboxSweep
        + InboxReplay
        + InboxRelay
        + DeadLetterQueue
        + ?Sized
{
}

/// A listing's `limit`, or `default` when the caller passed 0 ("no limit given").
pub(crate) fn limit_or(limit: usize, default: usize) -> usize {
    if limit == 0 {
        default
    } else {
        limit
    }
}
