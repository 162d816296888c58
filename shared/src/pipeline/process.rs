//! The process function: claim → decide → guarded commit → finish.
//!
//! The processor Lambda (one SQS batch per invocation) and `einmal serve` (a local
//! polling loop, [`Processor::run_local`]) both call [`Processor::process_message`]
//! for each pointer message; only acknowledgement differs ([`AckMode`]).
//!
//! # Exactly-once effects
//!
//! 1. **Claim** the inbox item: one conditional write moves it to `processing` with
//!    a lease. A duplicate message of a finished item, or one whose item another
//!    worker holds, stops here. A store may start without a lease instead
//!    ([`InboxProcessing::begin`]: DynamoDB takes the item from the message that
//!    carried it, no call); its finish then applies to any item not yet terminal.
//! 2. **Decide**: the [`Domain`] names the records it needs ([`Domain::targets`]),
//!    they are loaded, and it returns the changes ([`Domain::decide`]).
//! 3. **Guard**: every change whose effect key is already applied (on the record that
//!    holds it: its own, or the owner named by [`Change::keyed_on`]) is dropped; the
//!    rest are committed in one atomic write conditioned on the versions that were
//!    loaded, together with a version check of every loaded record the decision does
//!    not change (unless the domain opts that read out, [`Domain::guards_read`]). A
//!    conflict (another event changed a record in between) reloads and decides again,
//!    for as long as the records keep moving (see [`lanes`](super::lanes): within a
//!    process, the decisions on one record take turns, so they rarely conflict).
//!    A commit that would grow a record's `applied` set past [`MAX_APPLIED_KEYS`] is a
//!    permanent failure: no record may grow with the number of events that touched it.
//! 4. **Finish** the inbox item (completed / ignored / retryable / dead_letter) with
//!    the result, only if the lease is still ours.
//!
//! A crash anywhere is safe: before the commit nothing happened; after it, the
//! redelivered message finds the effect key applied and only finishes the item.
//!
//! # Hints (thin webhooks)
//!
//! Providers that sign nothing (Mollie classic, GoPay, Klarna KCO push) only name a
//! resource; their envelopes have the event type `hint.{kind}` (`providers::thin`).
//! Before step 2 such an item is *enriched*: the resource is fetched from the
//! provider's API with the tenant's credentials ([`ResourceLookup`], wired with
//! [`Processor::with_lookup`]) and the domain sees the fetched JSON as the body and
//! `{kind}` as the event type. Nothing of the request itself reaches the domain, so a
//! forged hint cannot cause an effect. A transient lookup failure (5xx, timeout)
//! retries like any other; a permanent one (404, bad credentials, no lookup
//! configured) dead-letters the item.
//!
//! # Telemetry
//!
//! Every message's outcome lands in [`Processor::metrics`] (completed, ignored, dead
//! letters, retries by [`RetryCause`], processing time); every committed effect adds
//! its lag (the provider's event time, `occurred_at`, else our receive time, to the
//! commit) and, for a **payment event**, whether that lag was within the SLI
//! threshold. A payment event is one whose committed changes move a record's
//! `payment_status` field ([`PAYMENT_STATUS_FIELD`]): paid, failed, refunded; a new
//! record created in its initial `pending` status does not count. Events that never
//! commit (dead letters) are counted by `DeadLetters`, not by the SLI. The processor
//! Lambda prints the tally as one EMF line per batch.
//!
//! # Waiting for a prerequisite
//!
//! [`DomainError::Wait`] (a refund before its order, ...) is not a failure and spends
//! no retry budget: the item is *parked* (`waiting`, with the record it waits on, the
//! first of its [`Domain::targets`], and since when) and its message is deleted, so
//! no receive count or redrive can dead-letter it. It is woken by a new pointer:
//! - every decision that changes a record (committed now, or found already applied on
//!   a redelivery after a crash) re-enqueues up to [`WAKE_LIMIT`] waiters parked on
//!   it, found through the store's waiters' index ([`InboxProcessing::waiters`]).
//!   Before parking, the event marks the record it waits on
//!   ([`StateStore::mark_waited`]); a commit reports the marks it removed
//!   ([`StateStore::commit_waking`]), so the index is asked only for marked records
//!   (a store that cannot tell, the embedded one, is asked for every changed record;
//!   so is every store on a redelivery that finds the change applied);
//! - after parking, the processor re-reads the record it waits on: if it changed
//!   since the decision (a commit that raced the park), it wakes itself;
//! - the sweeper re-sends parked items periodically at a bounded pace (the fallback).
//!
//! A waiter still waiting when its wait window has run out
//! ([`ProcessSettings::wait_window_ms`], default the provider's retry window from
//! [`crate::retention`]) is dead-lettered with "waited … for …".
//!
//! # Errors
//!
//! Only a permanent fact ends an event. Transient ([`StoreError::Unavailable`], a
//! lookup that timed out, contention that outlasted the in-process rounds): the item
//! becomes `retryable` and its message is *postponed* ([`Queue::postpone`]: replaced
//! by one visible after an exponential backoff with full jitter, up to
//! [`ProcessSettings::backoff_max_ms`]), so a throttle or an outage of any length
//! spends none of the redrive's `maxReceiveCount`; that stays the backstop for a
//! message whose handler crashes (or panics) every time. A transient failure is
//! dead-lettered only once the event is older than its retry horizon
//! ([`ProcessSettings::retry_horizon_ms`], default the provider's retry window: by
//! then the provider has stopped retrying too). Permanent
//! ([`DomainError::Permanent`], a corrupt body or record, a write the store rejects
//! for good, [`StoreError::Rejected`], such as an item over DynamoDB's size limit):
//! `dead_letter` at once with the reason, the pointer goes to the DLQ at once.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use thiserror::Error;
use tracing::Level;

use super::commit_group::{self, Member};
use super::lanes::Lanes;
use super::relay::Relay;
use crate::body;
use crate::config::Config;
use crate::config_source::ConfigSource;
use crate::destinations::Output;
use crate::domain::state::{
    CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite, Waiters,
    MAX_APPLIED_KEYS,
};
use crate::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use crate::envelope::Envelope;
use crate::lookup::{LookupError, ResourceLookup};
use crate::lookup_guard::{GuardSettings, GuardedLookup};
use crate::ports::{
    ClaimOutcome, Delivery, Finish, Inbox, InboxItem, InboxProcessing, InboxState, ItemVersion,
    Queue, QueueMessage, StoreError, WaitChange, Waiting, BODY_MISSING, ERROR_CLASS_PERMANENT,
    ERROR_CLASS_TRANSIENT, NO_RECORD,
};
use crate::providers::thin::HINT_PREFIX;
use crate::telemetry::emf::{RetryCause, WorkerMetrics, DEFAULT_SLI_THRESHOLD_MS};
use crate::telemetry::trace;
use crate::time;

/// The record field whose change makes an event a payment event (the business SLI).
pub const PAYMENT_STATUS_FIELD: &str = "payment_status";
/// A record created with this payment status is not a payment event.
const INITIAL_PAYMENT_STATUS: &str = "pending";

/// Lease length (`EINMAL_LEASE_MS`).
pub const LEASE_MS_ENV: &str = "EINMAL_LEASE_MS";
/// Must equal the queue's redrive `maxReceiveCount` (`EINMAL_MAX_RECEIVE_COUNT`).
pub const MAX_RECEIVE_COUNT_ENV: &str = "EINMAL_MAX_RECEIVE_COUNT";
pub const BACKOFF_BASE_MS_ENV: &str = "EINMAL_BACKOFF_BASE_MS";
pub const BACKOFF_MAX_MS_ENV: &str = "EINMAL_BACKOFF_MAX_MS";
pub const MAX_CONFLICT_RETRIES_ENV: &str = "EINMAL_MAX_CONFLICT_RETRIES";
/// The wait window for every provider (`EINMAL_WAIT_WINDOW_MS`); unset = each
/// provider's retry window.
pub const WAIT_WINDOW_MS_ENV: &str = "EINMAL_WAIT_WINDOW_MS";
/// How long transient failures are retried, for every provider
/// (`EINMAL_RETRY_HORIZON_MS`); unset = each provider's retry window.
pub const RETRY_HORIZON_MS_ENV: &str = "EINMAL_RETRY_HORIZON_MS";

/// The share of the lease a run may spend on conflict rounds that make progress
/// (`lease_ms / CONTENTION_SHARE`) before it postpones the event.
const CONTENTION_SHARE: i64 = 3;
/// The longest pause between two conflict rounds.
const CONFLICT_PAUSE_MAX_MS: f64 = 50.0;

/// Waiters woken per changed record per decision. More waiters on one record are
/// woken by the next change of it or by the sweeper's re-check.
pub const WAKE_LIMIT: usize = 100;

/// How much longer than the wait window a wait mark on a missing record is kept.
const WAIT_MARK_MARGIN_MS: i64 = 86_400_000;

/// Result recorded when every change of a decision had already been applied.
pub const ALREADY_APPLIED: &str = "already applied";

/// Messages taken per receive by [`Processor::run_local`].
const LOCAL_BATCH: u32 = 64;
/// Batches [`Processor::run_local`] works on at once: while some wait for their
/// commits, the next one is received and decided, so the store's writer always finds
/// a full group to commit. Bounds the messages in progress to
/// `LOCAL_BATCH * LOCAL_IN_FLIGHT`.
const LOCAL_IN_FLIGHT: usize = 8;
/// Pause of [`Processor::run_local`] when the queue is empty: an event arriving then
/// waits at most this long for its receive.
const LOCAL_IDLE: Duration = Duration::from_millis(50);
/// Pause of [`Processor::run_local`] after a failed receive.
const LOCAL_ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Returning a leased message a little after its lease ends avoids a second bounce.
const LEASE_MARGIN_MS: i64 = 250;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSettings {
    /// How long a claim holds the item; a worker that dies is replaced after it.
    /// Keep it above the longest processing time (Lambda: the function timeout).
    pub lease_ms: i64,
    /// The queue's redrive `maxReceiveCount`: the receive with this count is the
    /// last one, so a transient failure then dead-letters the item.
    pub max_receive_count: u32,
    /// Backoff before retry n (1-based): up to `min(max, base * 2^(n-1))`, full jitter.
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    /// Reload-and-decide rounds after a version conflict that found the records
    /// unchanged (no progress) before the event is postponed (transient). Rounds that
    /// find a record moved on go on until a third of the lease is spent.
    pub max_conflict_retries: u32,
    /// How long an event may wait for a prerequisite before it is dead-lettered.
    /// `None`: the provider's retry window ([`crate::retention::retry_window_days`]),
    /// as long as the provider may still deliver the prerequisite late.
    pub wait_window_ms: Option<i64>,
    /// How long after its receipt an event's transient failures are retried before it
    /// is dead-lettered. `None`: the provider's retry window, as long as the provider
    /// itself would keep retrying.
    pub retry_horizon_ms: Option<i64>,
}

impl Default for ProcessSettings {
    fn default() -> Self {
        ProcessSettings {
            lease_ms: 30_000,
            max_receive_count: 5,
            backoff_base_ms: 2_000,
            backoff_max_ms: 15 * 60_000,
            max_conflict_retries: 5,
            wait_window_ms: None,
            retry_horizon_ms: None,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{name}: {reason}")]
pub struct SettingsError {
    pub name: &'static str,
    pub reason: String,
}

impl ProcessSettings {
    /// Defaults overridden by `EINMAL_LEASE_MS`, `EINMAL_MAX_RECEIVE_COUNT`,
    /// `EINMAL_BACKOFF_BASE_MS`, `EINMAL_BACKOFF_MAX_MS`, `EINMAL_MAX_CONFLICT_RETRIES`,
    /// `EINMAL_WAIT_WINDOW_MS`, `EINMAL_RETRY_HORIZON_MS`.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`ProcessSettings::from_env`] with an injectable lookup. Empty counts as unset.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        fn read<T>(
            env: &impl Fn(&str) -> Option<String>,
            name: &'static str,
            default: T,
            min: T,
        ) -> Result<T, SettingsError>
        where
            T: std::str::FromStr + PartialOrd + std::fmt::Display,
        {
            let Some(raw) = env(name).filter(|v| !v.trim().is_empty()) else {
                return Ok(default);
            };
            let value: T = raw.trim().parse().map_err(|_| SettingsError {
                name,
                reason: format!("{raw:?} is not a number"),
            })?;
            if value < min {
                return Err(SettingsError {
                    name,
                    reason: format!("must be at least {min}"),
                });
            }
            Ok(value)
        }
        let d = ProcessSettings::default();
        let settings = ProcessSettings {
            lease_ms: read(&env, LEASE_MS_ENV, d.lease_ms, 1)?,
            max_receive_count: read(&env, MAX_RECEIVE_COUNT_ENV, d.max_receive_count, 1)?,
            backoff_base_ms: read(&env, BACKOFF_BASE_MS_ENV, d.backoff_base_ms, 0)?,
            backoff_max_ms: read(&env, BACKOFF_MAX_MS_ENV, d.backoff_max_ms, 0)?,
            max_conflict_retries: read(&env, MAX_CONFLICT_RETRIES_ENV, d.max_conflict_retries, 0)?,
            wait_window_ms: match env(WAIT_WINDOW_MS_ENV).filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(_) => Some(read(&env, WAIT_WINDOW_MS_ENV, 0i64, 1)?),
            },
            retry_horizon_ms: match env(RETRY_HORIZON_MS_ENV).filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(_) => Some(read(&env, RETRY_HORIZON_MS_ENV, 0i64, 1)?),
            },
        };
        if settings.backoff_max_ms < settings.backoff_base_ms {
            return Err(SettingsError {
                name: BACKOFF_MAX_MS_ENV,
                reason: format!("must be at least {BACKOFF_BASE_MS_ENV}"),
            });
        }
        Ok(settings)
    }

    /// The backoff ceiling before retry `attempt` (1-based): `min(max, base * 2^(attempt-1))`.
    pub fn backoff_cap_ms(&self, attempt: u32) -> i64 {
        let doublings = attempt.saturating_sub(1).min(62);
        self.backoff_base_ms
            .max(0)
            .saturating_mul(1i64 << doublings)
            .min(self.backoff_max_ms.max(0))
    }

    /// The wait window of an event of `provider` (see [`ProcessSettings::wait_window_ms`]).
    pub fn wait_window_ms_for(&self, provider: &str) -> i64 {
        self.wait_window_ms.unwrap_or_else(|| {
            i64::from(crate::retention::retry_window_days(provider)) * 86_400_000
        })
    }

    /// The retry horizon of an event of `provider` (see
    /// [`ProcessSettings::retry_horizon_ms`]).
    pub fn retry_horizon_ms_for(&self, provider: &str) -> i64 {
        self.retry_horizon_ms.unwrap_or_else(|| {
            i64::from(crate::retention::retry_window_days(provider)) * 86_400_000
        })
    }

    /// Full jitter: `jitter` in `[0, 1]` times the ceiling.
    pub fn backoff(&self, attempt: u32, jitter: f64) -> Duration {
        let cap = self.backoff_cap_ms(attempt) as f64;
        Duration::from_millis((cap * jitter.clamp(0.0, 1.0)).round() as u64)
    }
}

/// What to do with the queue message after [`Processor::process_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Done (completed, ignored, a duplicate of a finished item, an expired item):
    /// delete the message.
    Ack,
    /// A transient failure: the message comes back after `delay` without spending a
    /// receive of the redrive's budget ([`Queue::postpone`]; if that fails,
    /// ChangeMessageVisibility).
    Retry { delay: Duration },
    /// Make the message visible again after `delay`, its receive counted
    /// (ChangeMessageVisibility): another worker holds a live lease, or the run
    /// panicked (SQS's redrive is the backstop for a message that crashes every time).
    LeaveForLater { delay: Duration },
    /// The item is `dead_letter`: send the pointer to the DLQ, then delete the message.
    DeadLetterNow,
}

/// Who deletes handled messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// [`Processor::settle`] deletes them (local polling).
    Delete,
    /// The caller does: the Lambda SQS event source deletes every record not
    /// reported as a batch item failure.
    ByCaller,
}

/// The failure classes of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Transient(RetryCause, String),
    Permanent(String),
    /// A prerequisite is missing: park the item.
    Wait(WaitFor),
}

/// What a waiting decision waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WaitFor {
    /// The domain's message (`waiting: ...`).
    reason: String,
    /// The first target and the version the decision saw; `None` when the event
    /// targeted no record.
    record: Option<(StateKey, u64)>,
}

impl From<DomainError> for Failure {
    fn from(e: DomainError) -> Self {
        match e {
            DomainError::Permanent(_) => Failure::Permanent(e.to_string()),
            DomainError::Wait(_) => Failure::Wait(WaitFor {
                reason: e.to_string(),
                record: None,
            }),
        }
    }
}

impl From<LookupError> for Failure {
    fn from(e: LookupError) -> Self {
        match e {
            LookupError::Transient(_) => Failure::Transient(RetryCause::Lookup, e.to_string()),
            LookupError::Permanent(_) => Failure::Permanent(e.to_string()),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => {
                Failure::Transient(RetryCause::StoreUnavailable, e.to_string())
            }
            // A record that cannot be decoded will not heal by retrying; an operator
            // repairs it and replays the dead letter. Neither will a write the store
            // refuses for good (an item over the size limit).
            StoreError::Corrupt(_) | StoreError::Rejected(_) => Failure::Permanent(e.to_string()),
        }
    }
}

/// What a successful attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    /// The result, what this attempt committed, and the decision's domain outputs
    /// (of ALL its changes, so a re-run after a crash finds the same ones).
    Completed(String, Option<Committed>, Vec<Output>),
    Ignored(String),
}

/// An effect this attempt committed: when, and whether it moved a payment status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Committed {
    at_ms: i64,
    payment: bool,
}

/// What [`Processor::decide_and_commit`] did with one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOutcome {
    /// Changes were committed; the decision's result.
    Committed(String),
    /// Nothing new to commit: every change was already applied, or none was decided.
    Unchanged(String),
    /// The domain ignored the event, with the reason.
    Ignored(String),
}

/// Why [`Processor::decide_and_commit`] did not finish an event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EffectError {
    /// Will never succeed as is (the processor dead-letters such an event).
    #[error("permanent: {0}")]
    Permanent(String),
    /// May succeed later (the processor retries such an event).
    #[error("transient: {0}")]
    Transient(String),
    /// A prerequisite is missing (the processor parks such an event until it commits).
    #[error("waiting: {0}")]
    Wait(String),
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
type Jitter = Arc<dyn Fn() -> f64 + Send + Sync>;

pub struct Processor {
    inbox: Arc<dyn Inbox>,
    processing: Arc<dyn InboxProcessing>,
    queue: Arc<dyn Queue>,
    state: Arc<dyn StateStore>,
    domain: Arc<dyn Domain>,
    settings: ProcessSettings,
    now_ms: Clock,
    jitter: Jitter,
    /// Fetches the state named by hints, with the tenants' credentials.
    lookup: Option<(Arc<dyn ResourceLookup>, Arc<ConfigSource>)>,
    metrics: Arc<WorkerMetrics>,
    sli_threshold_ms: i64,
    /// Delivers finished events to the destinations before the finish write.
    relay: Option<Arc<Relay>>,
    /// How long a batch's business commits wait for each other (zero: not gathered).
    commit_gather: Duration,
    /// Decisions on one record take turns within this process.
    lanes: Lanes,
}

impl Processor {
    /// Every inbox port from one backend store.
    pub fn from_store(
        store: Arc<dyn crate::ports::InboxStore>,
        state: Arc<dyn StateStore>,
        domain: Arc<dyn Domain>,
    ) -> Self {
        Self::new(store.clone(), store.clone(), store, state, domain)
    }

    pub fn new(
        inbox: Arc<dyn Inbox>,
        processing: Arc<dyn InboxProcessing>,
        queue: Arc<dyn Queue>,
        state: Arc<dyn StateStore>,
        domain: Arc<dyn Domain>,
    ) -> Self {
        Processor {
            inbox,
            processing,
            queue,
            state,
            domain,
            settings: ProcessSettings::default(),
            now_ms: Arc::new(time::now_millis),
            jitter: Arc::new(rand::random::<f64>),
            lookup: None,
            metrics: Arc::new(WorkerMetrics::default()),
            sli_threshold_ms: DEFAULT_SLI_THRESHOLD_MS,
            relay: None,
            commit_gather: commit_group::DEFAULT_GATHER_WAIT,
            lanes: Lanes::default(),
        }
    }

    /// On a state store that gathers commits ([`StateStore::gathers_commits`]), the
    /// business commits of a batch ([`Processor::process_batch`]) go to the store
    /// together, each waiting at most `wait` for the others (`pipeline::commit_group`;
    /// default 50 ms); zero commits each on its own.
    pub fn with_commit_gather(mut self, wait: Duration) -> Self {
        self.commit_gather = wait;
        self
    }

    /// Deliver every `completed` / `ignored` event (and its decision's outputs) to the
    /// relay's destinations right after the commit; the finish write records the
    /// deliveries (no write of their own). Without a relay nothing is delivered.
    pub fn with_relay(mut self, relay: Arc<Relay>) -> Self {
        self.relay = Some(relay);
        self
    }

    pub fn relay(&self) -> Option<&Arc<Relay>> {
        self.relay.as_ref()
    }

    /// The business SLI threshold: a payment event's effect within this many
    /// milliseconds of the provider's event time counts as on time (default 60 s,
    /// `EINMAL_SLI_THRESHOLD_MS` in the Lambda).
    pub fn with_sli_threshold_ms(mut self, threshold_ms: i64) -> Self {
        self.sli_threshold_ms = threshold_ms;
        self
    }

    /// What was processed since the last drain (the Lambda drains once per batch).
    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.metrics
    }

    /// Enrich hints (thin webhooks) through `lookup`, with the tenants of `config`.
    /// Without it, hints are dead-lettered ("no resource lookup configured").
    pub fn with_lookup(self, lookup: Arc<dyn ResourceLookup>, config: Arc<Config>) -> Self {
        self.with_lookup_source(lookup, ConfigSource::fixed(config))
    }

    /// [`Processor::with_lookup`] with tenants from a source that refreshes itself, so
    /// rotated API credentials and new tenants take effect without a cold start.
    pub fn with_lookup_source(
        mut self,
        lookup: Arc<dyn ResourceLookup>,
        source: ConfigSource,
    ) -> Self {
        // Per-tenant concurrency and a circuit breaker around every provider API.
        let guarded =
            GuardedLookup::new(lookup, GuardSettings::default()).with_metrics(self.metrics.clone());
        self.lookup = Some((Arc::new(guarded), Arc::new(source)));
        self
    }

    pub fn with_settings(mut self, settings: ProcessSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Pin the clock (tests of leases).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    /// Replace the random jitter fraction in `[0, 1]` (tests: 1.0 = the full ceiling).
    pub fn with_jitter(mut self, jitter: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.jitter = Arc::new(jitter);
        self
    }

    pub fn settings(&self) -> &ProcessSettings {
        &self.settings
    }

    pub fn inbox(&self) -> &Arc<dyn Inbox> {
        &self.inbox
    }

    pub fn queue(&self) -> &Arc<dyn Queue> {
        &self.queue
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.settings.backoff(attempt, (self.jitter)())
    }

    /// Process one pointer message as `worker` (unique per process or invocation).
    /// Never fails: every problem becomes an outcome for the message.
    pub async fn process_message(&self, delivery: &Delivery, worker: &str) -> MessageOutcome {
        self.process_traced(delivery, worker, None).await
    }

    /// [`Processor::process_message`] for a message that carried the receiver's X-Ray
    /// trace header (SQS `AWSTraceHeader`): its trace id goes into the log lines.
    pub async fn process_traced(
        &self,
        delivery: &Delivery,
        worker: &str,
        trace_header: Option<&str>,
    ) -> MessageOutcome {
        self.process_in(delivery, worker, trace_header, None, None)
            .await
    }

    /// One message; its business commit goes through `commits` when the batch
    /// gathers them.
    async fn process_in(
        &self,
        delivery: &Delivery,
        worker: &str,
        trace_header: Option<&str>,
        commits: Option<&Member>,
        deliver_until: Option<Instant>,
    ) -> MessageOutcome {
        let trace_id = trace_header.and_then(trace::trace_id);
        let key = &delivery.message.pk;
        let started = Instant::now();
        let now = (self.now_ms)();
        let claim = self
            .processing
            .begin(delivery, worker, now, self.settings.lease_ms)
            .await;
        let (item, body_missing) = match claim {
            Ok(ClaimOutcome::Claimed(item)) => (item, false),
            // Its request was never acknowledged: the provider's retry stores the body
            // (`PutOutcome::Restored`). Transient until the retry horizon.
            Ok(ClaimOutcome::BodyMissing(item)) => (item, true),
            Ok(ClaimOutcome::Finished(state)) => {
                tracing::info!(pk = %key, state = %state, receive_count = delivery.receive_count,
                    trace_id, "duplicate message: event already finished");
                return MessageOutcome::Ack;
            }
            Ok(ClaimOutcome::Leased { until_ms }) => {
                let wait = until_ms.saturating_sub(now).max(0) + LEASE_MARGIN_MS;
                tracing::info!(pk = %key, lease_ms = wait, trace_id, "event leased by another worker");
                return MessageOutcome::LeaveForLater {
                    delay: millis(wait),
                };
            }
            Ok(ClaimOutcome::Missing) => {
                tracing::warn!(pk = %key, "message for an inbox item that does not exist (expired?)");
                return MessageOutcome::Ack;
            }
            Err(StoreError::Unavailable(e)) => {
                tracing::warn!(pk = %key, error = %e, trace_id, "claim failed; retrying later");
                self.count_retry(RetryCause::StoreUnavailable);
                return MessageOutcome::Retry {
                    delay: self.backoff(retry_number(delivery, 0)),
                };
            }
            Err(e @ (StoreError::Corrupt(_) | StoreError::Rejected(_))) => {
                // Nothing can be recorded on an item we cannot read: the DLQ keeps the
                // pointer for an operator.
                tracing::error!(pk = %key, error = %e, trace_id, "inbox item unreadable; dead-lettering the message");
                self.metrics.update(|t| t.dead_letters += 1);
                return MessageOutcome::DeadLetterNow;
            }
        };

        let result = if body_missing {
            Err(Failure::Transient(
                RetryCause::StoreUnavailable,
                format!(
                    "{BODY_MISSING}: the event's body was never stored (its request was not \
                     acknowledged; the provider's retry stores it)"
                ),
            ))
        } else {
            self.apply(&item, commits).await
        };
        if let Some(member) = commits {
            // Decided and committed (or not): the batch's other commits need not wait.
            member.done();
        }
        let attempt = item.attempts;
        // Deliver before the finish, so the same write records the deliveries.
        let delivered = match (&self.relay, &result) {
            (Some(relay), Ok(Applied::Completed(_, _, outputs))) => Some(
                relay
                    .deliver_event_until(&item, outputs, deliver_until)
                    .await,
            ),
            (Some(relay), Ok(Applied::Ignored(_))) => {
                Some(relay.deliver_event_until(&item, &[], deliver_until).await)
            }
            _ => None,
        };
        let mut retry_cause = None;
        let mut parked = None;
        let mut kept_result = false;
        let (mut finish, outcome) = match result {
            Ok(Applied::Completed(result, committed, _)) => {
                if let Some(committed) = committed {
                    self.count_effect(&item, committed, trace_id);
                }
                // A re-run (a forced replay of a completed event) that finds every effect
                // applied changes nothing: the event keeps its result.
                kept_result =
                    committed.is_none() && result == ALREADY_APPLIED && item.result.is_some();
                let result = (!kept_result).then_some(result);
                (
                    self.finish(InboxState::Completed, None, result),
                    MessageOutcome::Ack,
                )
            }
            Ok(Applied::Ignored(reason)) => (
                self.finish(InboxState::Ignored, None, Some(reason)),
                MessageOutcome::Ack,
            ),
            Err(Failure::Permanent(reason)) => (
                self.finish(
                    InboxState::DeadLetter,
                    Some((ERROR_CLASS_PERMANENT, reason)),
                    None,
                ),
                MessageOutcome::DeadLetterNow,
            ),
            Err(Failure::Wait(wait)) => {
                let since_ms = item.waiting.as_ref().map_or(now, |w| w.since_ms);
                let window_ms = self.settings.wait_window_ms_for(&item.envelope.provider);
                let waited_ms = (self.now_ms)().saturating_sub(since_ms);
                if waited_ms >= window_ms {
                    let reason = format!(
                        "waited {} (window {}) for {}",
                        human_duration(waited_ms),
                        human_duration(window_ms),
                        wait.reason
                    );
                    (
                        self.finish(
                            InboxState::DeadLetter,
                            Some((ERROR_CLASS_TRANSIENT, reason)),
                            None,
                        ),
                        MessageOutcome::DeadLetterNow,
                    )
                } else {
                    let on = wait
                        .record
                        .as_ref()
                        .map_or_else(|| NO_RECORD.to_string(), |(key, _)| key.pk());
                    let mut finish = self.finish(
                        InboxState::Waiting,
                        Some((ERROR_CLASS_TRANSIENT, wait.reason.clone())),
                        None,
                    );
                    finish.wait = WaitChange::Park(Waiting { on, since_ms });
                    parked = wait.record.clone();
                    (finish, MessageOutcome::Ack)
                }
            }
            Err(Failure::Transient(_, reason))
                if now.saturating_sub(item.received_at_ms)
                    >= self.settings.retry_horizon_ms_for(&item.envelope.provider) =>
            {
                let exhausted = format!(
                    "transient failures for {} (horizon {}), {} attempts",
                    human_duration(now.saturating_sub(item.received_at_ms)),
                    human_duration(self.settings.retry_horizon_ms_for(&item.envelope.provider)),
                    attempt.max(retry_number(delivery, 0))
                );
                // A missing body says so first: a late retry of the provider that
                // stores it takes the event back (`PutOutcome::Restored`).
                let reason = if body_missing {
                    format!("{reason}; retries exhausted: {exhausted}")
                } else {
                    format!("retries exhausted: {exhausted}: {reason}")
                };
                (
                    self.finish(
                        InboxState::DeadLetter,
                        Some((ERROR_CLASS_TRANSIENT, reason)),
                        None,
                    ),
                    MessageOutcome::DeadLetterNow,
                )
            }
            Err(Failure::Transient(cause, reason)) => {
                retry_cause = Some(cause);
                (
                    self.finish(
                        InboxState::Retryable,
                        Some((ERROR_CLASS_TRANSIENT, reason)),
                        None,
                    ),
                    MessageOutcome::Retry {
                        delay: self.backoff(retry_number(delivery, attempt)),
                    },
                )
            }
        };

        if finish.state != InboxState::Waiting && item.waiting.is_some() {
            finish.wait = WaitChange::Clear;
        }
        let mut handoffs = Vec::new();
        let resent = delivered.as_ref().map_or(0, |d| {
            d.deliveries.iter().filter(|s| s.attempts > 0).count()
        });
        if let Some(delivered) = delivered {
            finish.deliveries = Some(delivered.deliveries);
            finish.relay_due_ms = delivered.relay_due_ms;
            handoffs = delivered.handoffs;
        }
        let log = |level, message: &str, detail: Option<&str>| {
            log_attempt(
                level,
                &item,
                &finish,
                delivery.receive_count,
                trace_id,
                message,
                detail,
            )
        };
        // `begin` may hand the item out without a lease (its claim then names no owner).
        let leased = item.lease_owner.as_deref() == Some(worker);
        let finished = if leased {
            self.processing.finish(key, worker, &finish).await
        } else {
            self.processing
                .finish_unleased(key, item.attempts, ItemVersion::of(&item), &finish)
                .await
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        self.metrics.update(|t| {
            t.processing_ms.add(elapsed_ms);
            match (&finished, finish.state) {
                (Ok(true), InboxState::Completed) => t.completed += 1,
                (Ok(true), InboxState::Ignored) => t.ignored += 1,
                (Ok(true), InboxState::DeadLetter) => t.dead_letters += 1,
                (Ok(true), InboxState::Waiting) => t.parked += 1,
                (Ok(true), _) => {
                    if let Some(cause) = retry_cause {
                        *t.retries.entry(cause).or_default() += 1;
                    }
                }
                (Ok(false), _) => {}
                (Err(_), _) => *t.retries.entry(RetryCause::StoreUnavailable).or_default() += 1,
            }
        });
        match finished {
            Ok(true) => {
                let kept = kept_result.then(|| {
                    format!(
                        "effects already applied, nothing changed; deliveries re-sent: {resent}; \
                         result kept: {}",
                        item.result.as_deref().unwrap_or_default()
                    )
                });
                let detail =
                    (finish.error.as_deref().or(finish.result.as_deref())).or(kept.as_deref());
                let (level, message) = match finish.state {
                    InboxState::DeadLetter => (Level::ERROR, "event dead-lettered"),
                    InboxState::Retryable => (Level::WARN, "event will be retried"),
                    InboxState::Waiting => (Level::INFO, "event waits for a prerequisite"),
                    _ => (Level::INFO, "event processed"),
                };
                log(level, message, detail);
                if let Some((record, seen_version)) = parked {
                    self.recheck_parked(key, &record, seen_version).await;
                }
                if let (Some(relay), false) = (&self.relay, handoffs.is_empty()) {
                    // The next events of the objects this one released, now that its
                    // record is written.
                    relay.hand_on(handoffs).await;
                }
                outcome
            }
            Ok(false) if !leased => {
                // Handed out without a lease (`begin`): another run finished the item
                // first (a duplicate message), or a live lease holds it. Whatever we
                // committed is guarded by its effect key; nothing is left for this
                // message to do.
                log(Level::INFO, "event already finished by another run", None);
                MessageOutcome::Ack
            }
            Ok(false) => {
                // Our lease ran out and another worker claimed the item. Whatever we
                // committed is guarded by its effect key; that worker finishes it.
                log(
                    Level::WARN,
                    "lease lost before finishing; the new owner finishes",
                    None,
                );
                MessageOutcome::LeaveForLater {
                    delay: millis(self.settings.lease_ms),
                }
            }
            Err(e) => {
                // The item stays `processing` under our lease: come back after it.
                let error = e.to_string();
                log(
                    Level::WARN,
                    "could not finish the inbox item; retrying",
                    Some(&error),
                );
                let lease = millis(self.settings.lease_ms + LEASE_MARGIN_MS);
                MessageOutcome::Retry {
                    delay: self.backoff(retry_number(delivery, attempt)).max(lease),
                }
            }
        }
    }

    fn count_retry(&self, cause: RetryCause) {
        self.metrics
            .update(|t| *t.retries.entry(cause).or_default() += 1);
    }

    /// The business figures of a committed effect: lag from the provider's event time
    /// (our receive time when the provider gives none), and the SLI for payment events.
    fn count_effect(&self, item: &InboxItem, committed: Committed, trace_id: Option<&str>) {
        let since_ms = item
            .envelope
            .occurred_at
            .map_or(item.received_at_ms, |secs| secs.saturating_mul(1000));
        let lag_ms = committed.at_ms.saturating_sub(since_ms).max(0);
        let within = lag_ms <= self.sli_threshold_ms;
        self.metrics.update(|t| {
            t.effect_lag_ms.add(lag_ms as f64);
            if committed.payment {
                t.payment_within_slo.add(if within { 1.0 } else { 0.0 });
            }
        });
        if committed.payment && !within {
            tracing::warn!(
                pk = %item.key, lag_ms, threshold_ms = self.sli_threshold_ms, trace_id,
                "payment effect outside the SLI threshold"
            );
        }
    }

    fn finish(
        &self,
        state: InboxState,
        error: Option<(&str, String)>,
        result: Option<String>,
    ) -> Finish {
        let (error_class, error) = match error {
            Some((class, message)) => (Some(class.to_string()), Some(message)),
            None => (None, None),
        };
        Finish {
            state,
            error_class,
            error,
            result,
            now_ms: (self.now_ms)(),
            wait: WaitChange::Keep,
            deliveries: None,
            relay_due_ms: None,
        }
    }

    /// After parking: if the record waited on changed since the decision saw it (a
    /// commit whose wake ran before the park was visible), wake the item at once.
    async fn recheck_parked(&self, key: &crate::envelope::InboxKey, record: &StateKey, seen: u64) {
        match self.state.load(std::slice::from_ref(record)).await {
            Ok(current) if current.first().is_some_and(|r| r.version != seen) => {
                self.send_wake(key).await;
            }
            Ok(_) => {}
            // The sweeper's re-check covers it.
            Err(e) => tracing::warn!(pk = %key, error = %e, "cannot re-check a parked event"),
        }
    }

    /// A failed decision; for a wait, the record waited on (the first target) and, for
    /// an inbox item about to park, that record marked as waited on first, so that
    /// the commit that writes it next reports it ([`Waiters::Marked`]). The mark is
    /// set before the park and the re-check after it ([`Processor::recheck_parked`]),
    /// so a commit either sees the mark or changes the version the re-check compares.
    /// A mark that cannot be set is a transient failure: parked unmarked, the event
    /// would wait for the sweeper's re-check.
    async fn waiting(
        &self,
        failure: Failure,
        current: &[StateRecord],
        own: Option<&crate::envelope::InboxKey>,
        provider: &str,
    ) -> Failure {
        let Failure::Wait(wait) = failure else {
            return failure;
        };
        let Some(first) = current.first() else {
            return Failure::Wait(wait);
        };
        if own.is_some() {
            // The mark of a record that does not exist outlives every wait window.
            let keep_until_ms = (self.now_ms)()
                .saturating_add(self.settings.wait_window_ms_for(provider))
                .saturating_add(WAIT_MARK_MARGIN_MS);
            if let Err(e) = self.state.mark_waited(&first.key, keep_until_ms).await {
                return Failure::Transient(
                    RetryCause::StoreUnavailable,
                    format!("cannot mark {} as waited on: {e}", first.key.pk()),
                );
            }
        }
        Failure::Wait(WaitFor {
            record: Some((first.key.clone(), first.version)),
            ..wait
        })
    }

    /// Re-enqueue the items parked on `records` (bounded by [`WAKE_LIMIT`] each),
    /// except `own` (the event being processed), asking the store's waiters' index only
    /// for the records `waiters` says may have some. A failure is logged, not
    /// returned: the sweeper's re-check wakes what was missed.
    async fn wake_waiters(
        &self,
        records: &[String],
        waiters: &Waiters,
        own: Option<&crate::envelope::InboxKey>,
    ) {
        let mut records: Vec<&String> = match waiters {
            Waiters::Unknown => records.iter().collect(),
            Waiters::Marked(marked) => records
                .iter()
                .filter(|pk| marked.iter().any(|k| k.pk() == **pk))
                .collect(),
        };
        records.sort();
        records.dedup();
        for record in records {
            let waiters = match self.processing.waiters(record, WAKE_LIMIT).await {
                Ok(waiters) => waiters,
                Err(e) => {
                    tracing::warn!(record = %record, error = %e, "cannot look up waiters");
                    continue;
                }
            };
            for waiter in waiters.iter().filter(|w| Some(*w) != own) {
                self.send_wake(waiter).await;
            }
        }
    }

    async fn send_wake(&self, key: &crate::envelope::InboxKey) {
        let message = QueueMessage { pk: key.clone() };
        match self.queue.send(&message).await {
            Ok(()) => {
                self.metrics.update(|t| t.woken += 1);
                tracing::info!(pk = %key, "waiter woken");
            }
            Err(e) => tracing::warn!(pk = %key, error = %e, "cannot wake a waiter"),
        }
    }

    /// Decide and commit the event's effects (steps 2 and 3).
    async fn apply(&self, item: &InboxItem, commits: Option<&Member>) -> Result<Applied, Failure> {
        if item.body_encoding != body::BODY_ENCODING {
            return Err(Failure::Permanent(format!(
                "unknown body encoding {:?}",
                item.body_encoding
            )));
        }
        let limit = usize::try_from(item.body_len).unwrap_or(usize::MAX);
        let mut raw =
            body::decompress(&item.body, limit).map_err(|e| Failure::Permanent(e.to_string()))?;
        let mut envelope = &item.envelope;
        let enriched;
        if let Some(kind) = hint_kind(envelope) {
            let (fetched_envelope, fetched) = self.enrich(envelope, kind).await?;
            enriched = fetched_envelope;
            envelope = &enriched;
            raw = fetched;
        }
        let event = DomainEvent {
            envelope,
            body: &raw,
        };
        self.commit_event(&event, Some(&item.key), commits).await
    }

    /// Steps 2 and 3 for one domain event, without an inbox item: decide and commit its
    /// effects under the same guards as [`Processor::process_message`]. Tools and load
    /// tests drive the commit path with it.
    pub async fn decide_and_commit(
        &self,
        event: &DomainEvent<'_>,
    ) -> Result<EffectOutcome, EffectError> {
        match self.commit_event(event, None, None).await {
            Ok(Applied::Completed(result, Some(_), _)) => Ok(EffectOutcome::Committed(result)),
            Ok(Applied::Completed(result, None, _)) => Ok(EffectOutcome::Unchanged(result)),
            Ok(Applied::Ignored(reason)) => Ok(EffectOutcome::Ignored(reason)),
            Err(Failure::Permanent(reason)) => Err(EffectError::Permanent(reason)),
            Err(Failure::Transient(_, reason)) => Err(EffectError::Transient(reason)),
            Err(Failure::Wait(wait)) => Err(EffectError::Wait(wait.reason)),
        }
    }

    async fn commit_event(
        &self,
        event: &DomainEvent<'_>,
        own: Option<&crate::envelope::InboxKey>,
        commits: Option<&Member>,
    ) -> Result<Applied, Failure> {
        let event = *event;
        let targets = self.domain.targets(&event)?;
        let target_pks: Vec<String> = targets.iter().map(StateKey::pk).collect();
        // Our turn on the records: held from the load to the commit's answer, so the
        // next decision on them loads what this one committed.
        let mut lane = Some(
            self.lanes
                .enter(&target_pks, || {
                    if let Some(member) = commits {
                        member.away();
                    }
                })
                .await,
        );
        if let Some(member) = commits {
            member.back();
        }
        let contention_ends = Instant::now() + millis(self.settings.lease_ms / CONTENTION_SHARE);
        let mut seen_versions: Option<Vec<u64>> = None;
        let mut stalled = 0u32;
        let mut round = 0u32;
        loop {
            let current = if targets.is_empty() {
                Vec::new()
            } else {
                self.state.load(&targets).await?
            };
            if current.len() != targets.len() {
                return Err(Failure::Transient(
                    RetryCause::StoreUnavailable,
                    format!(
                        "state store returned {} of {} records",
                        current.len(),
                        targets.len()
                    ),
                ));
            }
            let decision = match self.domain.decide(&event, &current) {
                Ok(decision) => decision,
                Err(e) => {
                    let failure = Failure::from(e);
                    let provider = &event.envelope.provider;
                    return Err(self.waiting(failure, &current, own, provider).await);
                }
            };
            let (changes, result) = match decision {
                Decision::Ignore { reason } => return Ok(Applied::Ignored(reason)),
                Decision::Apply { changes, result } => (changes, result),
            };
            if changes.is_empty() {
                return Ok(Applied::Completed(result, None, Vec::new()));
            }
            // The records this decision changes: their waiters are woken once the
            // change is in (also when it was in already: a crash may have cut the
            // wake off after the commit).
            let changed: Vec<String> = changes.iter().map(|c| c.key.pk()).collect();
            let outputs = self.domain.outputs(&event, &changes);
            let writes = plan_writes(&current, changes)?;
            if writes.is_empty() {
                // Found applied: a crash may have cut the wake off after the commit
                // that removed the wait marks, so ask for every record.
                drop(lane.take());
                self.wake_waiters(&changed, &Waiters::Unknown, own).await;
                return Ok(Applied::Completed(
                    ALREADY_APPLIED.to_string(),
                    None,
                    outputs,
                ));
            }
            let reads = read_checks(&current, &writes, |key| {
                self.domain.guards_read(&event, key)
            });
            let answer = match commits {
                Some(member) => member.commit_waking(&writes, &reads).await,
                None => self.state.commit_waking(&writes, &reads).await,
            };
            match answer? {
                (CommitOutcome::Committed, waiters) => {
                    // The next decision on these records may go; waking is not part
                    // of this one.
                    drop(lane.take());
                    // Changed records whose change was applied before are not written:
                    // ask for them as on a redelivery.
                    let unwritten: Vec<String> = changed
                        .iter()
                        .filter(|pk| !writes.iter().any(|w| w.record.key.pk() == **pk))
                        .cloned()
                        .collect();
                    self.wake_waiters(&unwritten, &Waiters::Unknown, own).await;
                    let written: Vec<String> = writes.iter().map(|w| w.record.key.pk()).collect();
                    self.wake_waiters(&written, &waiters, own).await;
                    let committed = Committed {
                        at_ms: (self.now_ms)(),
                        payment: moves_payment_status(&current, &writes),
                    };
                    return Ok(Applied::Completed(result, Some(committed), outputs));
                }
                (CommitOutcome::Conflict, _) => {
                    // Another process committed in between (within this one the lane
                    // keeps others out). While the records keep moving that is
                    // progress, not failure: decide again on the new versions, until a
                    // share of the lease is spent. Rounds that find nothing changed
                    // are bounded by `max_conflict_retries`.
                    let versions: Vec<u64> = current.iter().map(|r| r.version).collect();
                    if seen_versions.as_ref() == Some(&versions) {
                        stalled += 1;
                    }
                    seen_versions = Some(versions);
                    round += 1;
                    self.metrics.update(|t| t.conflicts += 1);
                    tracing::debug!(event_id = %event.envelope.event_id, round, "state conflict; deciding again");
                    if stalled > self.settings.max_conflict_retries
                        || Instant::now() >= contention_ends
                    {
                        return Err(Failure::Transient(
                            RetryCause::Contention,
                            format!(
                                "lock contention: state changed under {round} consecutive attempts; postponed"
                            ),
                        ));
                    }
                    // Spread competing workers apart: jittered, doubling, capped.
                    let ceiling = (f64::from(1u32 << round.min(6))).min(CONFLICT_PAUSE_MAX_MS);
                    let pause = ceiling * (self.jitter)();
                    tokio::time::sleep(Duration::from_micros((pause * 1000.0) as u64)).await;
                }
            }
        }
    }

    /// Fetch the resource a hint names: the envelope the domain sees (type `kind`) and
    /// the fetched body.
    async fn enrich(&self, hint: &Envelope, kind: &str) -> Result<(Envelope, Vec<u8>), Failure> {
        let Some((lookup, source)) = &self.lookup else {
            return Err(Failure::Permanent(
                "no resource lookup configured".to_string(),
            ));
        };
        let config = source.current().await;
        let tenant = config.tenant(&hint.provider, &hint.tenant).ok_or_else(|| {
            Failure::Permanent(format!(
                "tenant {}/{} is not configured for resource lookups",
                hint.provider, hint.tenant
            ))
        })?;
        let resource_id = hint
            .object_id
            .as_deref()
            .ok_or_else(|| Failure::Permanent("hint without a resource id".to_string()))?;
        let fetched = lookup
            .fetch(tenant, &hint.provider, kind, resource_id)
            .await?;
        let envelope = Envelope {
            event_type: kind.to_string(),
            ..hint.clone()
        };
        Ok((envelope, fetched))
    }

    /// Process a batch concurrently. One bad record never fails the others: even a
    /// panic in one becomes a retry of that message alone. On a store that gathers
    /// commits, the batch's business commits go to it together
    /// ([`Processor::with_commit_gather`]).
    pub async fn process_batch(
        &self,
        deliveries: &[Delivery],
        worker: &str,
    ) -> Vec<(String, MessageOutcome)> {
        self.process_batch_traced(deliveries, &[], worker).await
    }

    /// [`Processor::process_batch`] with each message's X-Ray trace header
    /// (`trace_headers[i]` for `deliveries[i]`; missing entries mean none).
    pub async fn process_batch_traced(
        &self,
        deliveries: &[Delivery],
        trace_headers: &[Option<String>],
        worker: &str,
    ) -> Vec<(String, MessageOutcome)> {
        self.process_batch_until(deliveries, trace_headers, worker, None)
            .await
    }

    /// [`Processor::process_batch_traced`] whose inline deliveries end at
    /// `deliver_until` (the Lambda invocation's deadline less a margin): what is not
    /// delivered by then stays pending for the relay (`Relay::deliver_event_until`),
    /// so a slow destination never runs the invocation out of time after its commits.
    pub async fn process_batch_until(
        &self,
        deliveries: &[Delivery],
        trace_headers: &[Option<String>],
        worker: &str,
        deliver_until: Option<Instant>,
    ) -> Vec<(String, MessageOutcome)> {
        let gather =
            deliveries.len() > 1 && !self.commit_gather.is_zero() && self.state.gathers_commits();
        let mut members = if gather {
            commit_group::members(self.state.clone(), deliveries.len(), self.commit_gather)
        } else {
            Vec::new()
        }
        .into_iter();
        let runs = deliveries.iter().enumerate().map(|(i, delivery)| {
            let member = members.next();
            async move {
            let trace = trace_headers.get(i).and_then(|t| t.as_deref());
            // Dropped when the run ends (a panic included): the others stop waiting for it.
            let member = member;
            let outcome = AssertUnwindSafe(self.process_in(delivery, worker, trace, member.as_ref(), deliver_until))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(pk = %delivery.message.pk, "processing panicked; retrying later");
                    self.count_retry(RetryCause::Panic);
                    // Counted: a message that panics every time reaches the redrive.
                    MessageOutcome::LeaveForLater { delay: self.backoff(delivery.receive_count) }
                });
            (delivery.receipt.clone(), outcome)
            }
        });
        futures::future::join_all(runs).await
    }

    /// Apply an outcome to the queue. Returns `true` when the message stays in the
    /// queue (for Lambda: report it as a batch item failure).
    pub async fn settle(
        &self,
        delivery: &Delivery,
        outcome: MessageOutcome,
        mode: AckMode,
    ) -> bool {
        let pk = &delivery.message.pk;
        let ack = || async {
            if mode == AckMode::Delete {
                if let Err(e) = self.queue.ack(&delivery.receipt).await {
                    // Redelivered later; the claim then says it is finished.
                    tracing::warn!(pk = %pk, error = %e, "could not delete a handled message");
                }
            }
            false
        };
        match outcome {
            MessageOutcome::Ack => ack().await,
            MessageOutcome::Retry { delay } => !self.postpone(delivery, delay).await,
            MessageOutcome::LeaveForLater { delay } => {
                if let Err(e) = self.queue.change_visibility(&delivery.receipt, delay).await {
                    // It comes back after the receive's visibility timeout instead.
                    tracing::warn!(pk = %pk, error = %e, "could not set the retry delay");
                }
                true
            }
            MessageOutcome::DeadLetterNow => {
                match self.queue.send_dead_letter(&delivery.message).await {
                    Ok(()) => ack().await,
                    Err(e) => {
                        // Keep it: SQS redrive moves it after maxReceiveCount receives.
                        tracing::error!(pk = %pk, error = %e, "could not send to the dead-letter queue");
                        true
                    }
                }
            }
        }
    }

    /// Replace the message by one visible after `delay` ([`Queue::postpone`]). When
    /// that fails, the message itself comes back after `delay` (its receive counted).
    /// Returns whether it was replaced (the received one is gone).
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> bool {
        match self.queue.postpone(delivery, delay).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pk = %delivery.message.pk, error = %e, "could not postpone; the receive counts");
                if let Err(e) = self.queue.change_visibility(&delivery.receipt, delay).await {
                    // It comes back after the receive's visibility timeout instead.
                    tracing::warn!(pk = %delivery.message.pk, error = %e, "could not set the retry delay");
                }
                false
            }
        }
    }

    /// [`Processor::settle`] of a whole batch with [`AckMode::Delete`]: the pointers
    /// of dead-lettered items go to the DLQ first, then every handled message is
    /// deleted with one [`Queue::ack_batch`] while the retried ones get their
    /// visibility changes, so the batch settles in one group commit instead of one
    /// commit per message. Returns how many messages stay in the queue.
    pub async fn settle_batch(
        &self,
        deliveries: &[Delivery],
        outcomes: &[MessageOutcome],
    ) -> usize {
        let mut acks = Vec::with_capacity(deliveries.len());
        let mut later = Vec::new();
        let mut postponed = Vec::new();
        let mut dead = Vec::new();
        for (delivery, outcome) in deliveries.iter().zip(outcomes) {
            match *outcome {
                MessageOutcome::Ack => acks.push(delivery.receipt.clone()),
                MessageOutcome::Retry { delay } => postponed.push((delivery, delay)),
                MessageOutcome::LeaveForLater { delay } => later.push((delivery, delay)),
                MessageOutcome::DeadLetterNow => dead.push(delivery),
            }
        }
        let mut kept = later.len();
        let replaced = futures::future::join_all(
            postponed
                .iter()
                .map(|(delivery, delay)| self.postpone(delivery, *delay)),
        )
        .await;
        kept += replaced.iter().filter(|replaced| !**replaced).count();
        let sent = futures::future::join_all(
            dead.iter()
                .map(|d| async move { (*d, self.queue.send_dead_letter(&d.message).await) }),
        )
        .await;
        for (delivery, result) in sent {
            match result {
                Ok(()) => acks.push(delivery.receipt.clone()),
                Err(e) => {
                    // Keep it: SQS redrive moves it after maxReceiveCount receives.
                    tracing::error!(pk = %delivery.message.pk, error = %e, "could not send to the dead-letter queue");
                    kept += 1;
                }
            }
        }
        let delays = futures::future::join_all(later.iter().map(|(delivery, delay)| async move {
            if let Err(e) = self.queue.change_visibility(&delivery.receipt, *delay).await {
                // It comes back after the receive's visibility timeout instead.
                tracing::warn!(pk = %delivery.message.pk, error = %e, "could not set the retry delay");
            }
        }));
        let deleted = async {
            if acks.is_empty() {
                return;
            }
            if let Err(e) = self.queue.ack_batch(&acks).await {
                // Redelivered later; the claim then says they are finished.
                tracing::warn!(messages = acks.len(), error = %e, "could not delete handled messages");
            }
        };
        futures::future::join(delays, deleted).await;
        kept
    }

    /// The local worker loop of `einmal serve`: receive a batch, process it, settle it
    /// ([`Processor::settle_batch`]), with up to [`LOCAL_IN_FLIGHT`] batches at once
    /// (the next receive overlaps the processing of the last); pause briefly when the
    /// queue is empty. Returns when `shutdown` completes, after the batches in
    /// progress (and a receive under way) were finished.
    pub async fn run_local(&self, worker: &str, shutdown: impl Future<Output = ()>) -> LocalRun {
        tokio::pin!(shutdown);
        // Hidden at least as long as the lease, so a slow message is not received twice.
        let visibility = millis(self.settings.lease_ms + LEASE_MARGIN_MS);
        let mut run = LocalRun::default();
        let mut in_flight = futures::stream::FuturesUnordered::new();
        // Kept across iterations: a receive is never dropped half-way (its messages
        // would stay hidden for the visibility timeout).
        let mut receiving = None;
        let mut pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            if receiving.is_none() && pause.is_none() && in_flight.len() < LOCAL_IN_FLIGHT {
                receiving = Some(self.queue.receive(LOCAL_BATCH, visibility));
            }
            tokio::select! {
                _ = &mut shutdown => break,
                Some(()) = futures::StreamExt::next(&mut in_flight), if !in_flight.is_empty() => {}
                received = optional(&mut receiving) => {
                    receiving = None;
                    match received {
                        Ok(deliveries) if !deliveries.is_empty() => {
                            run.batches += 1;
                            run.messages += deliveries.len() as u64;
                            in_flight.push(self.run_local_batch(deliveries, worker));
                        }
                        Ok(_) => pause = Some(Box::pin(tokio::time::sleep(LOCAL_IDLE))),
                        Err(e) => {
                            tracing::warn!(error = %e, "receive failed");
                            pause = Some(Box::pin(tokio::time::sleep(LOCAL_ERROR_PAUSE)));
                        }
                    }
                }
                () = optional(&mut pause) => pause = None,
            }
        }
        if let Some(receive) = receiving {
            if let Ok(deliveries) = receive.await {
                if !deliveries.is_empty() {
                    run.batches += 1;
                    run.messages += deliveries.len() as u64;
                    in_flight.push(self.run_local_batch(deliveries, worker));
                }
            }
        }
        while futures::StreamExt::next(&mut in_flight).await.is_some() {}
        run
    }

    async fn run_local_batch(&self, deliveries: Vec<Delivery>, worker: &str) {
        let outcomes: Vec<MessageOutcome> = self
            .process_batch(&deliveries, worker)
            .await
            .into_iter()
            .map(|(_, outcome)| outcome)
            .collect();
        self.settle_batch(&deliveries, &outcomes).await;
    }
}

/// What [`Processor::run_local`] handled before it stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LocalRun {
    /// Non-empty batches received.
    pub batches: u64,
    /// Messages in them.
    pub messages: u64,
}

/// The output of the future in `slot`; never ready while the slot is empty.
async fn optional<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// The kind of a hint envelope (`hint.payment` → `payment`) of a thin provider (one
/// with a [`crate::providers::Provider::hint`]).
fn hint_kind(envelope: &Envelope) -> Option<&str> {
    crate::providers::lookup(&envelope.provider)?.hint()?;
    envelope
        .event_type
        .strip_prefix(HINT_PREFIX)
        .filter(|kind| !kind.is_empty())
}

/// One line per attempt: identifiers, state and the short reason; never the body.
fn log_attempt(
    level: Level,
    item: &InboxItem,
    finish: &Finish,
    receive_count: u32,
    trace_id: Option<&str>,
    message: &str,
    detail: Option<&str>,
) {
    let env = &item.envelope;
    macro_rules! emit {
        ($level:expr) => {
            tracing::event!(
                $level,
                provider = %env.provider,
                tenant = %env.tenant,
                event_id = %env.event_id,
                event_type = %env.event_type,
                object_id = env.object_id.as_deref(),
                state = %finish.state,
                attempt = item.attempts,
                receive_count,
                delivery_id = env.delivery_id.as_deref(),
                trace_id,
                detail,
                "{message}"
            )
        };
    }
    if level == Level::ERROR {
        emit!(Level::ERROR)
    } else if level == Level::WARN {
        emit!(Level::WARN)
    } else {
        emit!(Level::INFO)
    }
}

/// `90s`, `45m`, `26h`, `3d`: the largest whole unit (for dead-letter reasons).
fn human_duration(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 2 * 3_600 => format!("{}h", s / 3_600),
        s if s >= 2 * 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The retry number of an attempt (1-based, for the backoff): the most of the inbox
/// item's attempts, the message's receives and its postponements.
fn retry_number(delivery: &Delivery, attempts: u32) -> u32 {
    attempts
        .max(delivery.receive_count)
        .max(delivery.postponed.saturating_add(1))
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// True when the writes move some record's [`PAYMENT_STATUS_FIELD`] away from its
/// loaded value (a new record only when it is not created in the initial status).
fn moves_payment_status(current: &[StateRecord], writes: &[StateWrite]) -> bool {
    writes.iter().any(|write| {
        let Some(new) = write.record.data.get(PAYMENT_STATUS_FIELD) else {
            return false;
        };
        let old = current
            .iter()
            .find(|r| r.key == write.record.key)
            .and_then(|r| r.data.get(PAYMENT_STATUS_FIELD));
        match old {
            Some(old) => old != new,
            None => new.as_str() != Some(INITIAL_PAYMENT_STATUS),
        }
    })
}

/// The guarded writes of a decision: changes whose effect key is already applied are
/// dropped; the others become one write per record (version + 1, new data), expected
/// at the version that was loaded. Each effect key is added to the record that holds
/// it ([`Change::key_holder`]): a change keyed on an owner also writes the owner (with
/// its loaded data unless the owner changes too), so key and change commit together.
/// A write that would grow an `applied` set past [`MAX_APPLIED_KEYS`] is permanent.
fn plan_writes(current: &[StateRecord], changes: Vec<Change>) -> Result<Vec<StateWrite>, Failure> {
    let loaded = |key: &StateKey, what: &str| {
        current.iter().find(|r| r.key == *key).ok_or_else(|| {
            Failure::Permanent(format!(
                "domain {what} record {} that it did not list in its targets",
                key.pk()
            ))
        })
    };
    let mut writes: Vec<StateWrite> = Vec::new();
    for change in changes {
        let record = loaded(&change.key, "changed")?;
        let holder = loaded(change.key_holder(), "keyed a change on")?;
        // The holder has the key once applied; the changed record itself may hold it
        // too, from before its changes were keyed on an owner.
        if holder.applied.contains(&change.effect_key)
            || record.applied.contains(&change.effect_key)
        {
            continue;
        }
        write_of(&mut writes, record).record.data = change.data;
        write_of(&mut writes, holder)
            .record
            .applied
            .insert(change.effect_key);
    }
    for write in &writes {
        let keys = write.record.applied.len();
        let before = current
            .iter()
            .find(|r| r.key == write.record.key)
            .map_or(0, |r| r.applied.len());
        if keys > MAX_APPLIED_KEYS && keys > before {
            return Err(Failure::Permanent(format!(
                "record {} would hold {keys} effect keys, more than {MAX_APPLIED_KEYS}: a \
                 record that many events change must not collect a key per event; key \
                 those changes on the record that owns the effect (Change::keyed_on)",
                write.record.key.pk()
            )));
        }
    }
    Ok(writes)
}

/// The pending write of `loaded`'s record, created from the loaded record if needed.
fn write_of<'w>(writes: &'w mut Vec<StateWrite>, loaded: &StateRecord) -> &'w mut StateWrite {
    let at = match writes.iter().position(|w| w.record.key == loaded.key) {
        Some(at) => at,
        None => {
            let mut record = loaded.clone();
            record.version = loaded.version + 1;
            writes.push(StateWrite {
                record,
                expected_version: loaded.version,
            });
            writes.len() - 1
        }
    };
    &mut writes[at]
}

/// A version check for every loaded record the writes leave alone and whose read the
/// domain guards, so the decision cannot commit on a stale read.
fn read_checks(
    current: &[StateRecord],
    writes: &[StateWrite],
    guards_read: impl Fn(&StateKey) -> bool,
) -> Vec<ReadCheck> {
    let mut checks: Vec<ReadCheck> = Vec::new();
    for record in current {
        let written = writes.iter().any(|w| w.record.key == record.key);
        let checked = checks.iter().any(|c| c.key == record.key);
        if !written && !checked && guards_read(&record.key) {
            checks.push(ReadCheck {
                key: record.key.clone(),
                version: record.version,
            });
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hints_are_recognised_only_for_thin_providers() {
        let env = |provider: &str, event_type: &str| Envelope {
            provider: provider.into(),
            tenant: "t".into(),
            event_id: "e".into(),
            event_type: event_type.into(),
            object_id: Some("x".into()),
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        };
        assert_eq!(hint_kind(&env("mollie", "hint.payment")), Some("payment"));
        assert_eq!(hint_kind(&env("gopay", "hint.payment")), Some("payment"));
        assert_eq!(hint_kind(&env("klarna-push", "hint.order")), Some("order"));
        // Signed Mollie next-gen events are not hints.
        assert_eq!(hint_kind(&env("mollie", "payment-link.paid")), None);
        assert_eq!(hint_kind(&env("mollie", "hint.")), None);
        // Other providers' types are theirs, whatever they look like.
        assert_eq!(hint_kind(&env("standard-webhooks", "hint.payment")), None);
        assert_eq!(
            Failure::from(LookupError::Transient("x".into())),
            Failure::Transient(
                RetryCause::Lookup,
                "resource lookup failed (transient): x".into()
            )
        );
        assert!(matches!(
            Failure::from(LookupError::Permanent("x".into())),
            Failure::Permanent(_)
        ));
    }

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let s = ProcessSettings::default();
        let caps: Vec<i64> = (1..=12).map(|n| s.backoff_cap_ms(n)).collect();
        assert_eq!(&caps[..4], &[2_000, 4_000, 8_000, 16_000]);
        assert_eq!(caps[9], 900_000);
        assert_eq!(caps[11], 900_000);
        assert_eq!(s.backoff_cap_ms(0), 2_000);
        assert_eq!(s.backoff_cap_ms(u32::MAX), 900_000);
        assert_eq!(s.backoff(3, 1.0), Duration::from_secs(8));
        assert_eq!(s.backoff(3, 0.5), Duration::from_secs(4));
        assert_eq!(s.backoff(3, 0.0), Duration::ZERO);
        assert_eq!(s.backoff(3, 7.0), Duration::from_secs(8));
    }

    #[test]
    fn settings_from_env() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ProcessSettings::from_lookup(env(&[])).unwrap(),
            ProcessSettings::default()
        );
        let s = ProcessSettings::from_lookup(env(&[
            (LEASE_MS_ENV, "5000"),
            (MAX_RECEIVE_COUNT_ENV, " 3 "),
            (BACKOFF_BASE_MS_ENV, ""),
        ]))
        .unwrap();
        assert_eq!(
            (s.lease_ms, s.max_receive_count, s.backoff_base_ms),
            (5_000, 3, 2_000)
        );
        let err = ProcessSettings::from_lookup(env(&[(MAX_RECEIVE_COUNT_ENV, "0")])).unwrap_err();
        assert_eq!(err.name, MAX_RECEIVE_COUNT_ENV);
        let err = ProcessSettings::from_lookup(env(&[(LEASE_MS_ENV, "soon")])).unwrap_err();
        assert!(err.to_string().contains("not a number"), "{err}");
        let err = ProcessSettings::from_lookup(env(&[(BACKOFF_MAX_MS_ENV, "10")])).unwrap_err();
        assert_eq!(err.name, BACKOFF_MAX_MS_ENV);
        // The wait window: the provider's retry window unless configured.
        let d = ProcessSettings::default();
        assert_eq!(d.wait_window_ms_for("shopify"), 86_400_000);
        assert_eq!(d.wait_window_ms_for("stripe"), 3 * 86_400_000);
        assert_eq!(d.wait_window_ms_for("adyen"), 30 * 86_400_000);
        let s = ProcessSettings::from_lookup(env(&[(WAIT_WINDOW_MS_ENV, "3600000")])).unwrap();
        assert_eq!(s.wait_window_ms_for("adyen"), 3_600_000);
        for bad in ["0", "-5", "a day"] {
            let err = ProcessSettings::from_lookup(move |k: &str| {
                (k == WAIT_WINDOW_MS_ENV).then(|| bad.to_string())
            })
            .unwrap_err();
            assert_eq!(err.name, WAIT_WINDOW_MS_ENV, "{bad}");
        }
    }

    #[test]
    fn wait_durations_read_in_their_largest_unit() {
        assert_eq!(human_duration(45_000), "45s");
        assert_eq!(human_duration(119_000), "119s");
        assert_eq!(human_duration(31 * 60_000), "31m");
        assert_eq!(human_duration(86_460_000), "24h");
        assert_eq!(human_duration(3 * 86_400_000 + 1), "3d");
        assert_eq!(human_duration(-1), "0s");
    }

    #[test]
    fn a_wait_is_not_a_transient_failure() {
        assert_eq!(
            Failure::from(DomainError::Wait("order 1".into())),
            Failure::Wait(WaitFor {
                reason: "waiting: order 1".into(),
                record: None
            })
        );
    }

    fn record(id: &str, version: u64, applied: &[&str]) -> StateRecord {
        StateRecord {
            key: StateKey::new("t", "counter", id),
            version,
            data: json!({ "count": version }),
            applied: applied.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn change(id: &str, effect: &str, count: u64) -> Change {
        Change::new(
            StateKey::new("t", "counter", id),
            effect,
            json!({ "count": count }),
        )
    }

    #[test]
    fn plan_drops_applied_effects_and_merges_per_record() {
        let current = [record("a", 3, &["e1"]), record("b", 0, &[])];
        let writes = plan_writes(
            &current,
            vec![
                change("a", "e1", 4),
                change("b", "e2", 1),
                change("b", "e3", 2),
            ],
        )
        .unwrap();
        assert_eq!(writes.len(), 1);
        let w = &writes[0];
        assert_eq!((w.expected_version, w.record.version), (0, 1));
        assert_eq!(w.record.data, json!({ "count": 2 }));
        assert_eq!(w.record.applied.iter().collect::<Vec<_>>(), ["e2", "e3"]);

        assert!(plan_writes(&current, vec![change("a", "e1", 9)])
            .unwrap()
            .is_empty());
        let writes = plan_writes(&current, vec![change("a", "e4", 4)]).unwrap();
        assert_eq!(
            (writes[0].expected_version, writes[0].record.version),
            (3, 4)
        );
        assert_eq!(writes[0].record.applied.len(), 2);
    }

    #[test]
    fn a_change_keyed_on_its_owner_leaves_the_shared_record_keyless() {
        let order = StateKey::new("t", "order", "o1");
        let sku = StateKey::new("t", "sku", "s1");
        let loaded = |key: &StateKey, version: u64, applied: &[&str]| StateRecord {
            key: key.clone(),
            version,
            data: json!({ "v": version }),
            applied: applied.iter().map(|s| s.to_string()).collect(),
        };
        let current = [loaded(&order, 0, &[]), loaded(&sku, 7, &["seed"])];
        let stock = |key: &str| Change::keyed_on(sku.clone(), order.clone(), key, json!(6));
        let writes = plan_writes(
            &current,
            vec![
                Change::new(order.clone(), "o1#created", json!("created")),
                stock("o1#stock#s1"),
            ],
        )
        .unwrap();
        assert_eq!(writes.len(), 2);
        let (o, s) = (&writes[0], &writes[1]);
        assert_eq!((o.expected_version, o.record.version), (0, 1));
        assert_eq!(o.record.data, json!("created"));
        assert_eq!(
            o.record.applied.iter().collect::<Vec<_>>(),
            ["o1#created", "o1#stock#s1"]
        );
        assert_eq!((s.expected_version, s.record.version), (7, 8));
        assert_eq!(s.record.data, json!(6));
        assert_eq!(s.record.applied.iter().collect::<Vec<_>>(), ["seed"]);

        // Alone, the companion still writes its owner (unchanged data) to hold the key.
        let writes = plan_writes(&current, vec![stock("o1#stock#s1")]).unwrap();
        assert_eq!(writes[0].record.key, sku);
        assert_eq!(writes[1].record.key, order);
        assert_eq!(writes[1].record.data, current[0].data);
        assert!(writes[1].record.applied.contains("o1#stock#s1"));

        // Applied on the owner, or on the shared record from before: dropped.
        let done = [loaded(&order, 1, &["o1#stock#s1"]), loaded(&sku, 8, &[])];
        assert!(plan_writes(&done, vec![stock("o1#stock#s1")])
            .unwrap()
            .is_empty());
        let legacy = [loaded(&order, 1, &[]), loaded(&sku, 8, &["o1#stock#s1"])];
        assert!(plan_writes(&legacy, vec![stock("o1#stock#s1")])
            .unwrap()
            .is_empty());

        // The owner must be one of the targets.
        let err = plan_writes(&current[1..], vec![stock("k")]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m) if m.contains("keyed a change on record t#order#o1")),
            "{err:?}"
        );
    }

    #[test]
    fn a_record_collecting_a_key_per_event_fails_at_the_bound() {
        let full: Vec<String> = (0..MAX_APPLIED_KEYS).map(|i| format!("e{i}")).collect();
        let keys: Vec<&str> = full.iter().map(String::as_str).collect();
        let current = [record("hot", 5, &keys)];
        let err = plan_writes(&current, vec![change("hot", "one-more", 6)]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m)
                if m.contains("t#counter#hot") && m.contains(&MAX_APPLIED_KEYS.to_string())),
            "{err:?}"
        );
        // At the bound but not growing (a companion write, a restated key): allowed.
        assert!(plan_writes(&current, vec![change("hot", "e1", 6)])
            .unwrap()
            .is_empty());
        let owner = StateKey::new("t", "counter", "owner");
        let with_owner = [current[0].clone(), record("owner", 1, &[])];
        let writes = plan_writes(
            &with_owner,
            vec![Change::keyed_on(
                current[0].key.clone(),
                owner,
                "new",
                json!(1),
            )],
        )
        .unwrap();
        assert_eq!(writes[0].record.applied.len(), MAX_APPLIED_KEYS);
    }

    #[test]
    fn every_unchanged_read_is_checked_unless_the_domain_opts_out() {
        let current = [
            record("a", 3, &[]),
            record("b", 0, &[]),
            record("c", 2, &[]),
            record("a", 3, &[]),
        ];
        let writes = plan_writes(&current, vec![change("a", "e", 4)]).unwrap();
        let checks = read_checks(&current, &writes, |_| true);
        assert_eq!(
            checks,
            [
                ReadCheck {
                    key: StateKey::new("t", "counter", "b"),
                    version: 0
                },
                ReadCheck {
                    key: StateKey::new("t", "counter", "c"),
                    version: 2
                },
            ]
        );
        let checks = read_checks(&current, &writes, |k| k.id != "c");
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].key.id, "b");
    }

    #[test]
    fn payment_events_move_a_payment_status() {
        let with = |id: &str, version: u64, status: Option<&str>| StateRecord {
            key: StateKey::new("t", "order", id),
            version,
            data: match status {
                Some(s) => json!({ "payment_status": s }),
                None => serde_json::Value::Null,
            },
            applied: Default::default(),
        };
        let write = |record: StateRecord| StateWrite {
            expected_version: record.version.saturating_sub(1),
            record,
        };
        let pending = with("1", 1, Some("pending"));
        assert!(moves_payment_status(
            std::slice::from_ref(&pending),
            &[write(with("1", 2, Some("paid")))]
        ));
        assert!(!moves_payment_status(
            std::slice::from_ref(&pending),
            &[write(with("1", 2, Some("pending")))]
        ));
        // A new order in its initial status is not a payment; a new paid one is.
        let missing = with("1", 0, None);
        assert!(!moves_payment_status(
            std::slice::from_ref(&missing),
            &[write(with("1", 1, Some("pending")))]
        ));
        assert!(moves_payment_status(
            &[missing],
            &[write(with("1", 1, Some("paid")))]
        ));
        // Records without the field (stock) never are.
        assert!(!moves_payment_status(&[], &[write(with("1", 1, None))]));
    }

    #[test]
    fn a_change_outside_the_targets_is_permanent() {
        let err = plan_writes(&[record("a", 1, &[])], vec![change("zzz", "e", 1)]).unwrap_err();
        assert!(
            matches!(err, Failure::Permanent(ref m) if m.contains("t#counter#zzz")),
            "{err:?}"
        );
    }
}
