//! The relay: delivers each finished event (and each domain output of its decision)
//! to every matching destination, with a stable key, and retries what failed.
//!
//! # Where deliveries happen and where they are recorded
//!
//! The processor calls [`Relay::deliver_event`] right after the business commit and
//! before its `finish` write; the same finish records the outcome on the inbox item
//! ([`InboxItem::deliveries`], [`InboxItem::relay_due_ms`]), so the happy path costs
//! no write of its own. A crash before the finish processes the event again and
//! delivers again with the same key (the destination dedups on it): at least once,
//! never lost.
//!
//! Pending deliveries are retried by [`Relay::run_due`] (`einmal serve` every second,
//! the sweeper Lambda on AWS): it finds the due items through the store's index, takes
//! a short relay lease on each ([`InboxRelay::claim_relay`]), attempts the due entries
//! and writes the outcomes back in one conditional write ([`InboxRelay::finish_relay`]).
//!
//! # Retries
//!
//! [`RetryPolicy`]: exponential backoff with full jitter from 5 s, doubling, capped at
//! 1 h; a `Retry-After` larger than that is taken as the delay; bounded by the
//! destination's `max_attempts` and `max_age` (from the event's receipt), then
//! `dead_letter` with the last status and detail. [`SinkError::Permanent`]
//! dead-letters at once.
//!
//! # Per-object order (`ordered = true`)
//!
//! Events of one object (provider + tenant + object id) reach an ordered destination
//! in version order ([`position`]), one in flight per object, through a cursor per
//! destination and object ([`InboxRelay::order_acquire`]). Shuffled arrival: the first
//! event to queue on an idle object opens an order window
//! ([`RelaySettings::order_window_ms`], default 2 s) before anything is sent, so a
//! burst that arrives shuffled within it is delivered fully in order; a straggler
//! whose provider version is strictly older than what the destination already has is
//! recorded `superseded` and never sent (rules in [`crate::order`]). A failing event holds back only its own object; when it is delivered or
//! dead-lettered the next event of the object is handed the turn at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

pub use super::sink_set::{BuildFailure, RelayDestination, RelayError, SinkFactory};
use super::sink_set::{DestinationSet, SinkSlot};
use crate::body;
use crate::config_source::ConfigSource;
use crate::destinations::filter::{matches_event, matches_output};
use crate::destinations::http::envelope_body;
use crate::destinations::{
    delivery_key, output_delivery_key, BodyFormat, DestinationConfig, DestinationKind, Message,
    Output, SinkError,
};
use crate::envelope::{Envelope, InboxKey};
use crate::ports::{
    order_cursor_id, DeliveryState, DeliveryStatus, InboxItem, InboxRelay, OrderClaim, OrderGate,
    OrderPosition, OrderRelease, ReleaseOutcome, StoreError,
};
use crate::telemetry::catalog;
use crate::telemetry::emf::Emf;
use crate::time;

/// Backoff before the second attempt; doubles per attempt (full jitter).
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// The backoff ceiling.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// The default order window of ordered destinations.
pub const DEFAULT_ORDER_WINDOW: Duration = Duration::from_secs(2);
/// Items one [`Relay::run_due`] call takes at most by default.
pub const DEFAULT_RUN_LIMIT: usize = 100;
/// Pending items the backlog metrics read at most (beyond it counts are lower bounds).
pub const BACKLOG_SCAN_MAX: usize = 10_000;
/// Items handed the turn of their object in one pass (a long chain continues on the
/// next pass through the index).
const MAX_HANDOFFS: usize = 1_000;
/// Deliveries of one item run concurrently; items of one pass this many at a time.
const ITEM_CONCURRENCY: usize = 8;
/// The most characters of a detail (error, answer excerpt) kept on the record.
pub const MAX_DETAIL_CHARS: usize = 200;

/// Backoff, `Retry-After`, attempts and age: what happens after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: DEFAULT_BACKOFF_BASE,
            cap: DEFAULT_BACKOFF_CAP,
        }
    }
}

/// What the policy decided for a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Try again at this time (Unix ms).
    RetryAt(i64),
    /// Give up, with the reason.
    DeadLetter(String),
}

impl RetryPolicy {
    /// The ceiling before attempt `attempts + 1`: `min(cap, base * 2^(attempts-1))`.
    pub fn ceiling(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// After attempt number `attempts` (1-based) failed with `error` at `now_ms`:
    /// retry (full jitter `jitter` in `[0, 1]` times the ceiling, or the
    /// `Retry-After` when larger, never past the age limit) or dead-letter.
    pub fn after_failure(
        &self,
        destination: &DestinationConfig,
        attempts: u32,
        received_at_ms: i64,
        now_ms: i64,
        error: &SinkError,
        jitter: f64,
    ) -> NextStep {
        let retry_after = match error {
            SinkError::Permanent { .. } => {
                return NextStep::DeadLetter(format!("permanent failure: {error}"))
            }
            SinkError::Retry { retry_after, .. } => *retry_after,
        };
        if attempts >= destination.max_attempts {
            return NextStep::DeadLetter(format!(
                "{attempts} attempts exhausted (max_attempts {}): {error}",
                destination.max_attempts
            ));
        }
        let deadline = received_at_ms.saturating_add(millis(destination.max_age));
        if now_ms >= deadline {
            return NextStep::DeadLetter(format!(
                "older than max_age ({}s): {error}",
                destination.max_age.as_secs()
            ));
        }
        let jittered = self.ceiling(attempts).mul_f64(jitter.clamp(0.0, 1.0));
        let delay = retry_after.map_or(jittered, |after| after.max(jittered));
        // One last attempt at the deadline rather than none.
        NextStep::RetryAt(now_ms.saturating_add(millis(delay)).min(deadline))
    }
}

/// The detail of a delivery the processor left for the relay at its deadline.
pub const LEFT_FOR_RELAY: &str = "left for the relay at the invocation's deadline";

/// The backoff between two builds of a sink: the delivery policy's, capped lower.
fn slot_backoff(settings: &RelaySettings) -> (Duration, Duration) {
    let cap = settings
        .policy
        .cap
        .min(super::sink_set::SINK_BUILD_BACKOFF_CAP);
    (settings.policy.base.min(cap), cap)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The relay's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    pub policy: RetryPolicy,
    /// How long [`Relay::run_due`] holds an item: above the longest sink timeout.
    pub lease: Duration,
    /// The order window of ordered destinations (see the module documentation).
    pub order_window: Duration,
    /// How long pending deliveries to a destination that left the configuration are
    /// kept (then dead-lettered, naming it). See [`DEFAULT_DESTINATION_GRACE`].
    pub destination_grace: Duration,
}

/// The default grace of a removed destination: one hour. Far above the functions'
/// configuration TTL (60 s), so every function has seen a reload that brings the
/// destination back (a rename in two edits, a rolled-back change) before anything is
/// dead-lettered; short enough that a destination removed on purpose does not keep a
/// backlog (and its alarm) for long. Dead-lettered deliveries can still be replayed.
pub const DEFAULT_DESTINATION_GRACE: Duration = Duration::from_secs(3600);
/// A delivery to a removed destination looks again at most this often (the
/// destination may come back with a reload) until its grace ends.
const GONE_RECHECK: Duration = Duration::from_secs(60);

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            policy: RetryPolicy::default(),
            lease: Duration::from_secs(60),
            order_window: DEFAULT_ORDER_WINDOW,
            destination_grace: DEFAULT_DESTINATION_GRACE,
        }
    }
}

/// `EINMAL_RELAY_BACKOFF_BASE_MS`, `EINMAL_RELAY_BACKOFF_CAP_MS`,
/// `EINMAL_RELAY_ORDER_WINDOW_MS`, `EINMAL_RELAY_LEASE_MS`: the relay's settings.
pub const RELAY_BACKOFF_BASE_MS_ENV: &str = "EINMAL_RELAY_BACKOFF_BASE_MS";
pub const RELAY_BACKOFF_CAP_MS_ENV: &str = "EINMAL_RELAY_BACKOFF_CAP_MS";
pub const RELAY_ORDER_WINDOW_MS_ENV: &str = "EINMAL_RELAY_ORDER_WINDOW_MS";
pub const RELAY_LEASE_MS_ENV: &str = "EINMAL_RELAY_LEASE_MS";
/// `EINMAL_DESTINATION_GRACE_MS`: [`RelaySettings::destination_grace`].
pub const DESTINATION_GRACE_MS_ENV: &str = "EINMAL_DESTINATION_GRACE_MS";

impl RelaySettings {
    /// Defaults overridden by the `EINMAL_RELAY_*` variables (empty = unset).
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`RelaySettings::from_env`] with an injectable lookup.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = |name: &str, default: Duration| -> Result<Duration, String> {
            match env(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(raw) => raw
                    .trim()
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| format!("{name}: {raw:?} is not a number of milliseconds")),
            }
        };
        let d = RelaySettings::default();
        let settings = RelaySettings {
            policy: RetryPolicy {
                base: read(RELAY_BACKOFF_BASE_MS_ENV, d.policy.base)?,
                cap: read(RELAY_BACKOFF_CAP_MS_ENV, d.policy.cap)?,
            },
            lease: read(RELAY_LEASE_MS_ENV, d.lease)?,
            order_window: read(RELAY_ORDER_WINDOW_MS_ENV, d.order_window)?,
            destination_grace: read(DESTINATION_GRACE_MS_ENV, d.destination_grace)?,
        };
        if settings.policy.cap < settings.policy.base {
            return Err(format!(
                "{RELAY_BACKOFF_CAP_MS_ENV}: must be at least {RELAY_BACKOFF_BASE_MS_ENV}"
            ));
        }
        if settings.lease.is_zero() {
            return Err(format!("{RELAY_LEASE_MS_ENV}: must be above 0"));
        }
        Ok(settings)
    }
}

/// The order position of an event: its object version as a number or an RFC 3339
/// time (ms), else `occurred_at` (ms), else the receive time; ties in arrival order,
/// then by event id. Only the object version can make it superseded.
pub fn position(envelope: &Envelope, received_at_ms: i64) -> OrderPosition {
    let version = envelope.object_version.as_deref().and_then(|v| {
        let v = v.trim();
        v.parse::<i64>()
            .ok()
            .or_else(|| time::parse_rfc3339(v).map(|secs| secs.saturating_mul(1000)))
    });
    let at = version
        .or_else(|| envelope.occurred_at.map(|secs| secs.saturating_mul(1000)))
        .unwrap_or(received_at_ms);
    OrderPosition {
        at,
        received_ms: received_at_ms,
        event_id: envelope.event_id.clone(),
        version,
    }
}

/// Short, on one line, at most [`MAX_DETAIL_CHARS`] characters.
pub fn short_detail(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = one_line.trim();
    match trimmed.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((at, _)) => format!("{}…", &trimmed[..at]),
        None => trimmed.to_string(),
    }
}

/// The most characters of a delivery's detail an operator view shows
/// ([`excerpt`]).
pub const EXCERPT_CHARS: usize = 120;

/// A recorded detail for display (`einmal dlq list`, the console): at most `max`
/// characters (an ellipsis when cut), every control or invisible character escaped
/// (`\u{1b}`): a destination's answer is not the operator's terminal's to drive.
pub fn excerpt(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max)
        .collect::<String>()
        .escape_debug()
        .collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// What [`Relay::deliver_event`] produced: the record for the finish write, and the
/// items of ordered objects handed the turn ([`Relay::hand_on`] after the finish).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventDeliveries {
    pub deliveries: Vec<DeliveryStatus>,
    pub relay_due_ms: Option<i64>,
    pub handoffs: Vec<Handoff>,
}

/// An item whose delivery to `destination` now heads its object's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pub item: InboxKey,
    pub destination: String,
}

/// What one [`Relay::run_due`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Items claimed and written back.
    pub items: usize,
    pub attempts: usize,
}

/// Per destination: what the relay did since the last drain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayTally {
    pub delivered: BTreeMap<String, u64>,
    pub failed: BTreeMap<String, u64>,
    pub dead_lettered: BTreeMap<String, u64>,
    pub superseded: BTreeMap<String, u64>,
}

impl RelayTally {
    pub fn emf(&self, deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        for (name, map) in [
            (catalog::DELIVERIES_DELIVERED, &self.delivered),
            (catalog::DELIVERIES_FAILED, &self.failed),
            (catalog::DELIVERIES_DEAD_LETTERED, &self.dead_lettered),
            (catalog::DELIVERIES_SUPERSEDED, &self.superseded),
        ] {
            for (destination, n) in map {
                emf.count_by(name, destination, *n);
            }
        }
        emf
    }
}

/// The backlog gauges ([`Relay::backlog`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Destination → (pending deliveries, oldest pending event's age in ms).
    pub per_destination: BTreeMap<String, (u64, i64)>,
    /// Objects of ordered destinations held by a failing delivery.
    pub held_objects: u64,
    /// Destination → dead-lettered deliveries in the store (given up, not replayed),
    /// from its index of them ([`InboxRelay::relay_dead`]).
    pub dead_letters: BTreeMap<String, u64>,
}

impl Backlog {
    /// Always emitted per configured destination (zero too), so an alarm sees recovery.
    pub fn emf(&self, destinations: &[String], deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        for name in destinations {
            let (count, age_ms) = self.per_destination.get(name).copied().unwrap_or((0, 0));
            emf.put_by(catalog::DELIVERY_BACKLOG, name, count as f64);
            emf.put_by(
                catalog::DELIVERY_BACKLOG_AGE,
                name,
                age_ms.max(0) as f64 / 1000.0,
            );
            let dead = self.dead_letters.get(name).copied().unwrap_or(0);
            emf.put_by(catalog::DELIVERY_DEAD_LETTERS, name, dead as f64);
        }
        emf.put(catalog::DELIVERY_HELD_OBJECTS, self.held_objects as f64);
        emf
    }
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
type Jitter = Arc<dyn Fn() -> f64 + Send + Sync>;

/// The destinations with their sinks, the retry policy, and the store's relay port.
pub struct Relay {
    store: Arc<dyn InboxRelay>,
    /// Read by cloning the `Arc` (never held across I/O); replaced on a reload.
    destinations: RwLock<Arc<DestinationSet>>,
    /// With a source: the set follows the configuration's reloads.
    source: Option<ConfigSource>,
    factory: Option<Arc<dyn SinkFactory>>,
    settings: RelaySettings,
    owner: String,
    now_ms: Clock,
    jitter: Jitter,
    tally: Mutex<RelayTally>,
    /// Numbers this relay's ordered attempts: each is a run that holds its object's
    /// turn alone ([`OrderClaim::run`]).
    runs: AtomicU64,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("destinations", &self.destination_names())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// One delivery being worked on.
struct Work {
    status: DeliveryStatus,
    destination: Option<RelayDestination>,
    /// Whether to attempt it now (a pending entry that is due, or handed the turn).
    due: bool,
}

impl Relay {
    /// Build every destination's sink through `factory`, concurrently, each attempt
    /// time-bounded: a configuration error stops the start (the first, named); a
    /// destination that cannot be reached now is kept, its deliveries retried until
    /// its sink builds (`pipeline::sink_set`).
    pub async fn build(
        store: Arc<dyn InboxRelay>,
        configs: &[DestinationConfig],
        factory: Arc<dyn SinkFactory>,
        settings: RelaySettings,
    ) -> Result<Self, RelayError> {
        let backoff = slot_backoff(&settings);
        let slots = futures::future::join_all(
            configs
                .iter()
                .map(|c| SinkSlot::start(c.clone(), factory.clone(), backoff)),
        )
        .await;
        let mut destinations = Vec::with_capacity(configs.len());
        for slot in slots {
            let slot = slot?;
            destinations.push(RelayDestination {
                config: slot.config().clone(),
                sink: Arc::new(slot),
            });
        }
        let mut relay = Self::new(store, destinations).with_settings(settings);
        relay.factory = Some(factory);
        Ok(relay)
    }

    /// [`Relay::build`] from `source`'s configuration, following its reloads: when the
    /// configuration changes, the set is rebuilt (unchanged destinations keep their
    /// sinks; see [`DestinationSet::rebuilt`]).
    pub async fn reloading(
        store: Arc<dyn InboxRelay>,
        source: ConfigSource,
        factory: Arc<dyn SinkFactory>,
        settings: RelaySettings,
    ) -> Result<Self, RelayError> {
        let config = source.snapshot();
        let relay = Self::build(store, config.destinations(), factory, settings).await?;
        relay.write_set(|set| set.source = Some(config));
        Ok(Relay {
            source: Some(source),
            ..relay
        })
    }

    pub fn new(store: Arc<dyn InboxRelay>, destinations: Vec<RelayDestination>) -> Self {
        Relay {
            store,
            destinations: RwLock::new(Arc::new(DestinationSet::new(destinations, None))),
            source: None,
            factory: None,
            settings: RelaySettings::default(),
            owner: format!("relay-{}", hex::encode(rand::random::<[u8; 6]>())),
            now_ms: Arc::new(time::now_millis),
            jitter: Arc::new(rand::random::<f64>),
            tally: Mutex::new(RelayTally::default()),
            runs: AtomicU64::new(0),
        }
    }

    pub fn with_settings(mut self, settings: RelaySettings) -> Self {
        self.settings = settings;
        self
    }

    /// Replace the random jitter fraction in `[0, 1]` (tests).
    pub fn with_jitter(mut self, jitter: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.jitter = Arc::new(jitter);
        self
    }

    /// Pin the clock (tests).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    pub fn destination_names(&self) -> Vec<String> {
        self.set()
            .live()
            .iter()
            .map(|d| d.config.name.clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.set().live().is_empty()
    }

    /// The current destination set (a snapshot).
    pub fn set(&self) -> Arc<DestinationSet> {
        match self.destinations.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn write_set<T>(&self, change: impl FnOnce(&mut DestinationSet) -> T) -> T {
        let mut guard = self.destinations.write().unwrap_or_else(|p| p.into_inner());
        change(Arc::make_mut(&mut guard))
    }

    /// Follow a reload of the source's configuration: rebuild the set when the
    /// configuration is another one (no I/O: new sinks build on first use).
    pub async fn refresh(&self) {
        let (Some(source), Some(factory)) = (&self.source, &self.factory) else {
            return;
        };
        let config = source.current().await;
        let current = self.set();
        if current
            .source
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &config))
        {
            return;
        }
        let (next, changes) = current.rebuilt(
            config,
            factory,
            slot_backoff(&self.settings),
            (self.now_ms)(),
        );
        let mut guard = self.destinations.write().unwrap_or_else(|p| p.into_inner());
        // Another caller may have applied this (or a newer) configuration meanwhile.
        if !Arc::ptr_eq(&guard, &current) {
            return;
        }
        *guard = Arc::new(next);
        drop(guard);
        if !changes.is_empty() {
            tracing::info!(added = ?changes.added, changed = ?changes.changed,
                removed = ?changes.removed, "destinations reloaded");
        }
    }

    /// What was delivered since the last drain.
    pub fn drain_tally(&self) -> RelayTally {
        let mut guard = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *guard)
    }

    fn destination(&self, tenant: &str, name: &str) -> Option<RelayDestination> {
        self.set().get(tenant, name).cloned()
    }

    /// The deliveries a finished event gets: one per destination whose `events` match
    /// its type, one per output whose kind a destination's `outputs` match.
    pub fn plan(&self, envelope: &Envelope, outputs: &[Output]) -> Vec<DeliveryStatus> {
        let (provider, tenant) = (envelope.provider.as_str(), envelope.tenant.as_str());
        let mut planned = Vec::new();
        let set = self.set();
        for d in set.live() {
            let c = &d.config;
            if matches_event(c, provider, tenant, &envelope.event_type) {
                planned.push(fresh(
                    &c.name,
                    delivery_key(&c.name, provider, tenant, &envelope.event_id),
                    None,
                ));
            }
            for output in outputs {
                if matches_output(c, provider, tenant, &output.kind) {
                    planned.push(fresh(
                        &c.name,
                        output_delivery_key(&c.name, tenant, &output.key),
                        Some(output.clone()),
                    ));
                }
            }
        }
        planned
    }

    /// Deliver a finished event (`completed` / `ignored`, body included) and its
    /// decision's `outputs` to every matching destination, concurrently, each call
    /// bounded by its sink's timeout. Never fails: every problem becomes a pending
    /// or dead-lettered entry. Called by the processor before its finish write.
    pub async fn deliver_event(&self, item: &InboxItem, outputs: &[Output]) -> EventDeliveries {
        self.deliver_event_until(item, outputs, None).await
    }

    /// [`Relay::deliver_event`], every call also ending at `deadline` (the processor
    /// Lambda's remaining time less a margin): a delivery cut there, or not started
    /// by then, stays pending and due at once, for the relay.
    pub async fn deliver_event_until(
        &self,
        item: &InboxItem,
        outputs: &[Output],
        deadline: Option<Instant>,
    ) -> EventDeliveries {
        self.refresh().await;
        let planned = self.plan(&item.envelope, outputs);
        if planned.is_empty() {
            return EventDeliveries::default();
        }
        let work = planned
            .into_iter()
            .map(|status| Work {
                destination: self.destination(&item.envelope.tenant, &status.destination),
                status,
                due: true,
            })
            .collect();
        self.attempt_all(item, work, deadline).await
    }

    /// Retry what is due: up to `limit` items whose earliest pending delivery is due at
    /// `now_ms`, each under a relay lease; then the items handed the turn of their
    /// object. Store errors of single items are logged (the index finds them again).
    pub async fn run_due(&self, now_ms: i64, limit: usize) -> Result<RunReport, StoreError> {
        self.refresh().await;
        let keys = self.store.relay_due(now_ms, limit).await?;
        let mut report = RunReport::default();
        let mut handoffs: Vec<Handoff> = Vec::new();
        let results: Vec<_> = stream::iter(keys)
            .map(|key| async move { self.run_item(&key, None).await })
            .buffer_unordered(ITEM_CONCURRENCY)
            .collect()
            .await;
        for (attempts, more) in results.into_iter().flatten() {
            report.items += 1;
            report.attempts += attempts;
            handoffs.extend(more);
        }
        let more = self.hand_on(handoffs).await;
        report.items += more.items;
        report.attempts += more.attempts;
        Ok(report)
    }

    /// Deliver, at once, the items handed the turn of their object (bounded per call;
    /// what is left waits for its own due time).
    pub async fn hand_on(&self, mut handoffs: Vec<Handoff>) -> RunReport {
        let mut report = RunReport::default();
        let mut done = 0usize;
        while let Some(handoff) = handoffs.pop() {
            if done >= MAX_HANDOFFS {
                break;
            }
            done += 1;
            if let Some((attempts, more)) = self
                .run_item(&handoff.item, Some(&handoff.destination))
                .await
            {
                report.items += 1;
                report.attempts += attempts;
                handoffs.extend(more);
            }
        }
        report
    }

    /// One item under the relay lease: attempt its due entries (or, handed the turn,
    /// its pending entry for `forced`), write the outcomes back.
    async fn run_item(
        &self,
        key: &InboxKey,
        forced: Option<&str>,
    ) -> Option<(usize, Vec<Handoff>)> {
        let now = (self.now_ms)();
        let lease = millis(self.settings.lease);
        let item = match self.store.claim_relay(key, &self.owner, now, lease).await {
            Ok(Some(item)) => item,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(pk = %key, error = %e, "relay: cannot claim the item");
                return None;
            }
        };
        let work: Vec<Work> = item
            .deliveries
            .iter()
            .map(|status| {
                let pending = status.state == DeliveryState::Pending;
                let due = match forced {
                    Some(destination) => pending && status.destination == destination,
                    None => {
                        (pending || status.release_owed)
                            && status.next_attempt_ms.is_none_or(|at| at <= now)
                    }
                };
                Work {
                    destination: self.destination(&item.envelope.tenant, &status.destination),
                    status: status.clone(),
                    due,
                }
            })
            .collect();
        let attempts = work.iter().filter(|w| w.due).count();
        let result = self.attempt_all(&item, work, None).await;
        let finished = self
            .store
            .finish_relay(
                key,
                &self.owner,
                &result.deliveries,
                result.relay_due_ms,
                (self.now_ms)(),
            )
            .await;
        match finished {
            Ok(true) => {}
            Ok(false) => tracing::warn!(pk = %key, "relay lease lost; the next pass retries"),
            Err(e) => tracing::warn!(pk = %key, error = %e, "relay: cannot record deliveries"),
        }
        Some((attempts, result.handoffs))
    }

    async fn attempt_all(
        &self,
        item: &InboxItem,
        work: Vec<Work>,
        deadline: Option<Instant>,
    ) -> EventDeliveries {
        let raw = decode_body(item);
        let runs = work.into_iter().map(|w| {
            let raw = &raw;
            async move {
                if !w.due {
                    return (w.status, None);
                }
                let Some(destination) = w.destination else {
                    return (self.gone(&item.envelope.tenant, w.status), None);
                };
                if w.status.release_owed {
                    return self.release_owed(item, &destination.config, w.status).await;
                }
                match raw {
                    Ok(raw) => {
                        self.attempt(item, raw, &destination, w.status, deadline)
                            .await
                    }
                    Err(reason) => {
                        let mut status = w.status;
                        status.state = DeliveryState::DeadLetter;
                        status.next_attempt_ms = None;
                        status.detail = Some(short_detail(reason));
                        (status, None)
                    }
                }
            }
        });
        let results = futures::future::join_all(runs).await;
        let mut out = EventDeliveries::default();
        for (status, handoff) in results {
            if status.state == DeliveryState::Pending || status.release_owed {
                let at = status.next_attempt_ms.unwrap_or(0);
                out.relay_due_ms = Some(out.relay_due_ms.map_or(at, |due: i64| due.min(at)));
            }
            out.deliveries.push(status);
            out.handoffs.extend(handoff);
        }
        out
    }

    /// A due delivery whose destination is not in the configuration: kept pending
    /// through the grace period from when this process found it gone (it may come
    /// back with a reload), then dead-lettered, naming it.
    fn gone(&self, tenant: &str, mut status: DeliveryStatus) -> DeliveryStatus {
        let now = (self.now_ms)();
        let name = status.destination.clone();
        let since = self.write_set(|set| set.note_gone(tenant, &name, now));
        let until = since.saturating_add(millis(self.settings.destination_grace));
        if now < until {
            status.next_attempt_ms = Some(until.min(now.saturating_add(millis(GONE_RECHECK))));
            status.detail = Some(format!(
                "destination {name} no longer configured; kept until its grace period ends"
            ));
        } else {
            status.state = DeliveryState::DeadLetter;
            status.next_attempt_ms = None;
            status.detail = Some(format!("destination {name} no longer configured"));
            self.count(|t| &mut t.dead_lettered, &name);
        }
        status
    }

    /// One attempt of one delivery (ordered: after its object's turn is ours).
    async fn attempt(
        &self,
        item: &InboxItem,
        raw: &[u8],
        destination: &RelayDestination,
        mut status: DeliveryStatus,
        deadline: Option<Instant>,
    ) -> (DeliveryStatus, Option<Handoff>) {
        let config = &destination.config;
        let now = (self.now_ms)();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            status.next_attempt_ms = Some(now);
            status.detail = Some(LEFT_FOR_RELAY.into());
            return (status, None);
        }
        let order = self.order_claim(item, config, &status, now);
        if let Some(claim) = &order {
            match self.store.order_acquire(claim, now).await {
                Ok(OrderGate::Go) => {}
                // This very event already went out (a re-run after a crash between
                // the delivery and the record): it is delivered, not superseded.
                Ok(OrderGate::Superseded { delivered }) if delivered == claim.position => {
                    status.state = DeliveryState::Delivered;
                    status.next_attempt_ms = None;
                    status.detail = Some("delivered before (order cursor)".into());
                    return (status, None);
                }
                Ok(OrderGate::Superseded { delivered }) => {
                    status.state = DeliveryState::Superseded;
                    status.next_attempt_ms = None;
                    status.detail = Some(format!(
                        "superseded: the destination has a newer version (event {})",
                        delivered.event_id
                    ));
                    self.count(|t| &mut t.superseded, &config.name);
                    return (status, None);
                }
                Ok(OrderGate::Wait { until_ms }) => {
                    status.next_attempt_ms = Some(until_ms);
                    return (status, None);
                }
                Err(e) => {
                    status.next_attempt_ms =
                        Some(now.saturating_add(millis(self.settings.policy.base)));
                    status.detail = Some(short_detail(&format!("order cursor: {e}")));
                    return (status, None);
                }
            }
        }
        let message = build_message(item, raw, config, &status);
        let started = Instant::now();
        let call = destination.sink.deliver(&message);
        let outcome = match deadline {
            None => Some(call.await),
            Some(d) => tokio::time::timeout_at(tokio::time::Instant::from_std(d), call)
                .await
                .ok(),
        };
        let Some(outcome) = outcome else {
            // Cut at the deadline: it may have arrived (the key dedups), so it counts
            // as an attempt, but it is no failure: due at once for the relay.
            status.attempts = status.attempts.saturating_add(1);
            status.last_attempt_ms = Some(now);
            status.next_attempt_ms = Some((self.now_ms)());
            status.detail = Some(LEFT_FOR_RELAY.into());
            tracing::info!(pk = %item.key, destination = %config.name, delivery = %status.key,
                "delivery cut at the invocation's deadline; left for the relay");
            return (status, None);
        };
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        status.attempts = status.attempts.saturating_add(1);
        status.last_attempt_ms = Some(now);
        status.last_latency_ms = Some(latency_ms);
        let after = (self.now_ms)();
        match outcome {
            Ok(delivered) => {
                status.state = DeliveryState::Delivered;
                status.last_status = delivered.status;
                status.next_attempt_ms = None;
                status.detail = delivered.note.as_deref().map(short_detail);
                self.count(|t| &mut t.delivered, &config.name);
            }
            Err(error) => {
                status.last_status = error.status();
                status.detail = Some(short_detail(&error.to_string()));
                match self.settings.policy.after_failure(
                    config,
                    status.attempts,
                    item.received_at_ms,
                    after,
                    &error,
                    (self.jitter)(),
                ) {
                    NextStep::RetryAt(at) => {
                        status.next_attempt_ms = Some(at);
                        self.count(|t| &mut t.failed, &config.name);
                    }
                    NextStep::DeadLetter(reason) => {
                        status.state = DeliveryState::DeadLetter;
                        status.next_attempt_ms = None;
                        status.detail = Some(short_detail(&reason));
                        self.count(|t| &mut t.dead_lettered, &config.name);
                    }
                }
            }
        }
        tracing::info!(
            pk = %item.key, destination = %config.name, delivery = %status.key,
            state = %status.state, attempts = status.attempts, status = status.last_status,
            latency_ms, "delivery attempt"
        );
        let handoff = match order {
            Some(claim) => self.end_turn(claim, &mut status, after).await,
            None => None,
        };
        (status, handoff)
    }

    /// Hand an ordered delivery's turn back: a retry keeps its place (only the hold is
    /// freed), a delivered or dead-lettered one leaves the queue and the next event is
    /// handed the turn. A release the store refuses is owed: the entry stays due
    /// ([`DeliveryStatus::release_owed`]) and the relay's next pass releases it, so a
    /// lost release never blocks the object until its queue entry goes stale.
    async fn end_turn(
        &self,
        claim: OrderClaim,
        status: &mut DeliveryStatus,
        now: i64,
    ) -> Option<Handoff> {
        let outcome = match status.state {
            DeliveryState::Pending => ReleaseOutcome::Retrying,
            DeliveryState::Delivered => ReleaseOutcome::Delivered(claim.position.clone()),
            _ => ReleaseOutcome::Failed,
        };
        let retrying = outcome == ReleaseOutcome::Retrying;
        let release = OrderRelease {
            cursor: claim.cursor,
            key: claim.key,
            run: claim.run,
            outcome,
        };
        match self.store.order_release(&release, now).await {
            Ok(_) if retrying => None,
            Ok(next) => next.map(|item| Handoff {
                item,
                destination: status.destination.clone(),
            }),
            // A retry's hold lapses by itself (`hold_ms`).
            Err(e) if retrying => {
                tracing::warn!(destination = %status.destination, error = %e,
                    "relay: cannot free the object's turn; it lapses");
                None
            }
            Err(e) => {
                tracing::warn!(destination = %status.destination, error = %e,
                    "relay: cannot release the object's turn; the next pass does");
                status.release_owed = true;
                status.next_attempt_ms =
                    Some(now.saturating_add(millis(self.settings.policy.base)));
                None
            }
        }
    }

    /// Release the turn an ended ordered delivery still owes (see [`Relay::end_turn`]).
    async fn release_owed(
        &self,
        item: &InboxItem,
        config: &DestinationConfig,
        mut status: DeliveryStatus,
    ) -> (DeliveryStatus, Option<Handoff>) {
        let now = (self.now_ms)();
        status.release_owed = false;
        status.next_attempt_ms = None;
        // No longer ordered (or no object): nothing holds a turn for it.
        let Some(claim) = self.order_claim(item, config, &status, now) else {
            return (status, None);
        };
        let handoff = self.end_turn(claim, &mut status, now).await;
        (status, handoff)
    }

    fn order_claim(
        &self,
        item: &InboxItem,
        config: &DestinationConfig,
        status: &DeliveryStatus,
        now: i64,
    ) -> Option<OrderClaim> {
        if !config.ordered || status.output.is_some() {
            return None;
        }
        let e = &item.envelope;
        let object = e.object_id.as_deref()?;
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        Some(OrderClaim {
            cursor: order_cursor_id(&config.name, &e.provider, &e.tenant, object),
            key: status.key.clone(),
            run: format!("{}-{run}", self.owner),
            item: item.key.clone(),
            position: position(e, item.received_at_ms),
            window_ms: millis(self.settings.order_window),
            // Above any sink's timeout: a run holds the object only while it may send.
            hold_ms: millis(self.settings.lease),
            // Far past the destination's age budget: that entry is abandoned.
            stale_before_ms: now
                .saturating_sub(millis(config.max_age))
                .saturating_sub(millis(self.settings.lease) * 2),
            retain_until_secs: item.expires_at,
        })
    }

    fn count(&self, which: impl FnOnce(&mut RelayTally) -> &mut BTreeMap<String, u64>, name: &str) {
        let mut guard = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        *which(&mut guard).entry(name.to_string()).or_default() += 1;
    }

    /// The backlog gauges: pending deliveries per destination (count, oldest event's
    /// age), objects held by a failing ordered delivery, and dead-lettered deliveries
    /// per destination; read through the two indexes (at most [`BACKLOG_SCAN_MAX`]
    /// items each).
    pub async fn backlog(&self, now_ms: i64) -> Result<Backlog, StoreError> {
        let items = self.store.relay_pending(BACKLOG_SCAN_MAX).await?;
        let mut backlog = backlog_of(&items, now_ms, |name, tenant| {
            self.destination(tenant, name)
                .is_some_and(|d| d.config.ordered)
        });
        backlog.dead_letters = dead_letters_of(&self.store.relay_dead(BACKLOG_SCAN_MAX).await?);
        Ok(backlog)
    }
}

/// Re-schedule the dead-lettered deliveries of a finished event (`einmal replay`):
/// attempts reset, same keys, due at `now_ms`, under a short relay lease taken as
/// `owner`. Returns how many; `None` when the item is not finished, missing, or a relay
/// holds it.
pub async fn reschedule_dead_deliveries(
    store: &dyn InboxRelay,
    key: &InboxKey,
    owner: &str,
    now_ms: i64,
) -> Result<Option<usize>, StoreError> {
    const LEASE_MS: i64 = 30_000;
    let Some(item) = store.claim_relay(key, owner, now_ms, LEASE_MS).await? else {
        return Ok(None);
    };
    let mut deliveries = item.deliveries;
    let mut n = 0;
    for d in deliveries
        .iter_mut()
        .filter(|d| d.state == DeliveryState::DeadLetter)
    {
        d.state = DeliveryState::Pending;
        d.attempts = 0;
        d.next_attempt_ms = Some(now_ms);
        n += 1;
    }
    let due = deliveries
        .iter()
        .filter(|d| d.state == DeliveryState::Pending)
        .filter_map(|d| d.next_attempt_ms)
        .min();
    if !store
        .finish_relay(key, owner, &deliveries, due, now_ms)
        .await?
    {
        return Ok(None);
    }
    Ok(Some(n))
}

fn fresh(destination: &str, key: String, output: Option<Output>) -> DeliveryStatus {
    DeliveryStatus {
        destination: destination.to_string(),
        key,
        state: DeliveryState::Pending,
        attempts: 0,
        last_status: None,
        last_latency_ms: None,
        last_attempt_ms: None,
        next_attempt_ms: None,
        detail: None,
        output,
        release_owed: false,
    }
}

/// Destination → dead-lettered deliveries among `items`.
pub fn dead_letters_of(items: &[InboxItem]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for d in items
        .iter()
        .flat_map(|i| &i.deliveries)
        .filter(|d| d.state == DeliveryState::DeadLetter)
    {
        *out.entry(d.destination.clone()).or_default() += 1;
    }
    out
}

/// The backlog of `items` (pending ones, from the index) at `now_ms`.
pub fn backlog_of(
    items: &[InboxItem],
    now_ms: i64,
    ordered: impl Fn(&str, &str) -> bool,
) -> Backlog {
    let mut backlog = Backlog::default();
    let mut held = std::collections::BTreeSet::new();
    for item in items {
        let age = now_ms.saturating_sub(item.received_at_ms);
        for d in item
            .deliveries
            .iter()
            .filter(|d| d.state == DeliveryState::Pending || d.release_owed)
        {
            if d.state == DeliveryState::Pending {
                let entry = backlog
                    .per_destination
                    .entry(d.destination.clone())
                    .or_default();
                entry.0 += 1;
                entry.1 = entry.1.max(age);
            }
            // A failing ordered delivery keeps its object's head; an owed release
            // keeps it queued: either holds the object back.
            if (d.attempts > 0 || d.release_owed)
                && d.output.is_none()
                && ordered(&d.destination, &item.envelope.tenant)
            {
                if let Some(object) = &item.envelope.object_id {
                    let e = &item.envelope;
                    held.insert(order_cursor_id(
                        &d.destination,
                        &e.provider,
                        &e.tenant,
                        object,
                    ));
                }
            }
        }
    }
    backlog.held_objects = held.len() as u64;
    backlog
}

fn decode_body(item: &InboxItem) -> Result<Vec<u8>, String> {
    if item.body_encoding != body::BODY_ENCODING {
        return Err(format!("unknown body encoding {:?}", item.body_encoding));
    }
    let limit = usize::try_from(item.body_len).unwrap_or(usize::MAX);
    body::decompress(&item.body, limit).map_err(|e| format!("stored body unreadable: {e}"))
}

/// The bytes of one delivery: the output's JSON, the envelope, or the original body.
pub fn build_message(
    item: &InboxItem,
    raw: &[u8],
    config: &DestinationConfig,
    status: &DeliveryStatus,
) -> Message {
    let e = &item.envelope;
    let mut message = Message {
        key: status.key.clone(),
        destination: config.name.clone(),
        provider: e.provider.clone(),
        tenant: e.tenant.clone(),
        event_id: e.event_id.clone(),
        event_type: e.event_type.clone(),
        object_id: e.object_id.clone(),
        object_version: e.object_version.clone(),
        occurred_at: e.occurred_at,
        body: raw.to_vec(),
        content_type: content_type_of(raw).to_string(),
    };
    if let Some(output) = &status.output {
        message.event_type = output.kind.clone();
        message.object_id = output.object_id.clone();
        message.object_version = None;
        message.body = serde_json::to_vec(&output.data).unwrap_or_else(|_| b"null".to_vec());
        message.content_type = "application/json".into();
        return message;
    }
    if let DestinationKind::Http(http) = &config.kind {
        if http.body == BodyFormat::Envelope {
            message.body = envelope_body(&message);
            message.content_type = "application/json".into();
        }
    }
    message
}

/// The body as the provider sent it: JSON unless it looks like a form post.
fn content_type_of(raw: &[u8]) -> &'static str {
    match raw.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') | None => "application/json",
        _ => "application/x-www-form-urlencoded",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::http::{HttpDestination, DEFAULT_HTTP_TIMEOUT};

    fn dest(max_attempts: u32, max_age_secs: u64) -> DestinationConfig {
        DestinationConfig {
            name: "shop".into(),
            tenant: "demo".into(),
            provider: None,
            events: vec!["payment_intent.*".into()],
            outputs: vec!["notification.*".into()],
            ordered: false,
            max_attempts,
            max_age: Duration::from_secs(max_age_secs),
            kind: DestinationKind::Http(HttpDestination {
                url: "http://127.0.0.1:1/hook".into(),
                secrets: Vec::new(),
                body: BodyFormat::Original,
                timeout: DEFAULT_HTTP_TIMEOUT,
                allow_private: false,
            }),
        }
    }

    fn retry(after: Option<u64>) -> SinkError {
        SinkError::Retry {
            status: Some(503),
            retry_after: after.map(Duration::from_secs),
            detail: "unavailable".into(),
        }
    }

    const NOW: i64 = 1_000_000_000;

    #[test]
    fn backoff_doubles_from_5s_to_the_1h_cap_with_full_jitter() {
        let p = RetryPolicy::default();
        assert_eq!(p.ceiling(1), Duration::from_secs(5));
        assert_eq!(p.ceiling(2), Duration::from_secs(10));
        assert_eq!(p.ceiling(4), Duration::from_secs(40));
        assert_eq!(p.ceiling(20), Duration::from_secs(3600));
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(3600));
        let d = dest(100, 365 * 86_400);
        let at = |attempts, jitter| p.after_failure(&d, attempts, NOW, NOW, &retry(None), jitter);
        assert_eq!(at(1, 0.0), NextStep::RetryAt(NOW));
        assert_eq!(at(1, 1.0), NextStep::RetryAt(NOW + 5_000));
        assert_eq!(at(3, 0.5), NextStep::RetryAt(NOW + 10_000));
        assert_eq!(at(30, 1.0), NextStep::RetryAt(NOW + 3_600_000));
        // Jitter outside [0, 1] is clamped.
        assert_eq!(at(2, 7.0), NextStep::RetryAt(NOW + 10_000));
    }

    #[test]
    fn a_larger_retry_after_is_the_delay() {
        let p = RetryPolicy::default();
        let d = dest(10, 86_400);
        assert_eq!(
            p.after_failure(&d, 1, NOW, NOW, &retry(Some(120)), 1.0),
            NextStep::RetryAt(NOW + 120_000)
        );
        // A smaller one does not shorten the backoff.
        assert_eq!(
            p.after_failure(&d, 4, NOW, NOW, &retry(Some(1)), 1.0),
            NextStep::RetryAt(NOW + 40_000)
        );
    }

    #[test]
    fn attempts_age_and_permanent_errors_dead_letter() {
        let p = RetryPolicy::default();
        let d = dest(3, 3_600);
        assert!(matches!(
            p.after_failure(&d, 3, NOW, NOW, &retry(None), 0.5),
            NextStep::DeadLetter(r) if r.contains("3 attempts exhausted")
        ));
        assert!(matches!(
            p.after_failure(&d, 1, NOW - 3_600_000, NOW, &retry(None), 0.5),
            NextStep::DeadLetter(r) if r.contains("max_age")
        ));
        // Never scheduled past the age limit: one last attempt at it.
        assert_eq!(
            p.after_failure(&d, 1, NOW - 3_599_000, NOW, &retry(Some(600)), 0.5),
            NextStep::RetryAt(NOW + 1_000)
        );
        let permanent = SinkError::Permanent {
            status: Some(404),
            detail: "not found".into(),
        };
        assert!(matches!(
            p.after_failure(&d, 1, NOW, NOW, &permanent, 0.5),
            NextStep::DeadLetter(r) if r.contains("permanent")
        ));
    }

    #[test]
    fn positions_order_by_version_then_time_then_arrival() {
        let mut e = Envelope {
            provider: "shopify".into(),
            tenant: "demo".into(),
            event_id: "e2".into(),
            event_type: "orders/updated".into(),
            object_id: Some("1".into()),
            object_version: Some("2026-01-01T00:00:01Z".into()),
            occurred_at: Some(5),
            delivery_id: None,
        };
        let a = position(&e, 0);
        let ms = time::parse_rfc3339("2026-01-01T00:00:01Z").unwrap() * 1000;
        assert_eq!((a.at, a.version), (ms, Some(ms)));
        e.object_version = Some("17".into());
        assert_eq!(position(&e, 0).version, Some(17));
        // Not a version: ordered by occurred_at, never superseded.
        e.object_version = Some("v-x".into());
        assert_eq!((position(&e, 0).at, position(&e, 0).version), (5_000, None));
        e.object_version = None;
        e.occurred_at = None;
        assert_eq!(position(&e, 42).at, 42);
        // Ties go in arrival order, then by event id.
        let mut f = e.clone();
        f.event_id = "e0".into();
        assert!(position(&e, 42) < position(&f, 43));
        f.event_id = "e3".into();
        assert!(position(&e, 42) < position(&f, 42));
    }

    #[test]
    fn excerpts_are_bounded_and_escaped() {
        assert_eq!(excerpt("gone \u{1b}[2J", 120), "gone \\u{1b}[2J");
        let long = excerpt(&"é".repeat(300), 120);
        assert_eq!(long, format!("{}…", "é".repeat(120)));
        assert_eq!(excerpt("short", 120), "short");
    }

    #[test]
    fn details_are_short_and_on_one_line() {
        let long = "x".repeat(500);
        let d = short_detail(&format!("line1\nline2 {long}"));
        assert!(!d.contains('\n'));
        assert_eq!(d.chars().count(), MAX_DETAIL_CHARS + 1);
    }
}
