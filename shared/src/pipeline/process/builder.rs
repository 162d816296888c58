//! How a processor is put together: its ports, its settings and what it may call.

use std::sync::Arc;
use std::time::Duration;

use super::{ProcessSettings, Processor};
use crate::config::Config;
use crate::config_source::ConfigSource;
use crate::domain::state::StateStore;
use crate::domain::Domain;
use crate::lookup::ResourceLookup;
use crate::lookup_guard::{GuardSettings, GuardedLookup};
use crate::pipeline::commit_group;
use crate::pipeline::lanes::Lanes;
use crate::pipeline::relay::Relay;
use crate::ports::{Inbox, InboxProcessing, Queue};
use crate::telemetry::emf::{WorkerMetrics, DEFAULT_SLI_THRESHOLD_MS};
use crate::time;

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

    pub(super) fn backoff(&self, attempt: u32) -> Duration {
        self.settings.backoff(attempt, (self.jitter)())
    }
}
