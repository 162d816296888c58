//! `GET /metrics` of `einmal serve`: the EMF catalogue
//! ([`einmal::telemetry::catalog`]) in the Prometheus text format, so a local
//! deployment plugs into Prometheus and Grafana.
//!
//! Names are the catalogue's in snake case with an `einmal_` prefix and the
//! catalogue's unit (`WebhooksAccepted` → `einmal_webhooks_accepted_total`,
//! `ProcessingTime` → `einmal_processing_time_milliseconds`); counters end in `_total`,
//! the backlog figures are gauges read from the store at each scrape, the timings are
//! histograms (`PaymentWithinSlo` too: its `_sum` over `_count` is EMF's Average, the
//! share within the SLI). The per-provider/cause/destination dimension becomes a label.
//! Encoded with `prometheus-client` (the Prometheus project's Rust client): it writes
//! the `# HELP`/`# TYPE`/`# UNIT` lines, the escaping and the `_total` suffix.
//!
//! The processor's and relay's tallies are drained here, at each scrape and for the
//! minute log line; the log keeps its own "since the last line" tally. A drain keeps
//! at most the first 10,000 timing values of its interval (the tally's own bound), so
//! at more than 10,000 events between two drains a histogram's count is below the
//! `_total` counters; the counters are always exact. Nothing grows with traffic: the
//! histograms have fixed buckets and the label values are the retry causes, the
//! providers and the configured destinations.
//!
//! A scrape costs little and N scrapers cost one store read: the backlog gauges are
//! read at most once per [`BACKLOG_TTL`] (one reader at a time, the others get the
//! figures it read), the delivery backlog without bodies. Access: with a metrics token
//! every scrape needs `Authorization: Bearer <token>`; see `serve` for where
//! `/metrics` is served.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use einmal::adapters::embedded::EmbeddedStore;
use einmal::pipeline::relay::{Relay, RelayTally};
use einmal::ports::InboxSweep;
use einmal::telemetry::catalog::{self, MetricSpec, Unit};
use einmal::telemetry::emf::{Samples, WorkerMetrics, WorkerTally};
use einmal::telemetry::{IngestCounts, IngestMetrics};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{self, Registry};

/// Most pending items one scrape reads for `PendingItems` (the sweeper's default
/// batch): beyond it the gauge is a lower bound, and a scrape stays cheap.
const PENDING_SCAN_MAX: usize = 100;
/// How long the backlog gauges read from the store serve scrapes.
pub const BACKLOG_TTL: Duration = Duration::from_secs(5);
/// How long the embedded store's figures (`einmal_store_*`) serve scrapes: counting
/// rows reads each table's index.
pub const STORE_STATS_TTL: Duration = Duration::from_secs(60);
/// The shortest metrics token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

type Labels = Vec<(&'static str, String)>;

/// The metric objects, one per catalogue entry `einmal serve` has figures for.
#[derive(Default)]
struct Series {
    accepted: Counter,
    duplicates: Counter,
    signature_failures: Counter,
    rejected: Counter,
    unavailable: Counter,
    completed: Counter,
    ignored: Counter,
    dead_letters: Counter,
    parked: Counter,
    woken: Counter,
    conflicts: Counter,
    retries: Family<Labels, Counter>,
    lookup_circuits_open: Family<Labels, Gauge>,
    pending_items: Gauge,
    oldest_pending_age: Gauge,
    waiting_items: Gauge,
    oldest_waiting_age: Gauge,
    delivered: Family<Labels, Counter>,
    delivery_failed: Family<Labels, Counter>,
    delivery_dead_lettered: Family<Labels, Counter>,
    delivery_superseded: Family<Labels, Counter>,
    delivery_backlog: Family<Labels, Gauge>,
    delivery_backlog_age: Family<Labels, Gauge>,
    delivery_held_objects: Gauge,
    delivery_dead_letters: Family<Labels, Gauge>,
}

/// The embedded store's figures (`einmal store stats`), outside the EMF catalogue:
/// they exist only on `einmal serve`.
#[derive(Default)]
struct StoreSeries {
    rows: Family<Labels, Gauge>,
    file_bytes: Gauge,
    wal_bytes: Gauge,
    free_pages: Gauge,
    oldest_item_age: Gauge,
    next_purge_in: Gauge,
    /// 1 while the store refuses writes (disk full, I/O errors), else 0.
    writes_failing: Gauge,
}

/// What was drained but not yet logged, and the intake as last seen.
#[derive(Default)]
struct Drained {
    since_log: WorkerTally,
    relay_since_log: RelayTally,
    /// The intake counters at the last drain (`None`: none yet, all zero).
    intake: Option<IngestCounts>,
    since_start: Processed,
}

/// The processor's figures since `einmal serve` started, for the console's overview:
/// read from the same drain as `/metrics` and the log line, so no count is lost to
/// either. Fixed size: four counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Processed {
    pub completed: u64,
    pub dead_letters: u64,
    /// Payment events whose effect was measured against the SLI threshold.
    pub payments: u64,
    /// Those within it (`PaymentWithinSlo` is `within_slo / payments`).
    pub within_slo: u64,
}

/// The figures behind `/metrics` and the minute log line of `einmal serve`.
pub struct ServeMetrics {
    registry: Registry,
    series: Series,
    processing_ms: Histogram,
    effect_lag_ms: Histogram,
    payment_within_slo: Histogram,
    drained: Mutex<Drained>,
    intake: Arc<IngestMetrics>,
    worker: Arc<WorkerMetrics>,
    relay: Option<Arc<Relay>>,
    sweep: Arc<dyn InboxSweep>,
    destinations: Vec<String>,
    /// When the backlog gauges were last read; held across the read, so concurrent
    /// scrapes wait for one read instead of each doing their own.
    backlog_read: tokio::sync::Mutex<Option<Instant>>,
    store: Option<Arc<EmbeddedStore>>,
    store_series: StoreSeries,
    store_read: tokio::sync::Mutex<Option<Instant>>,
}

/// `WebhooksAccepted` → `webhooks_accepted`.
fn snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Register `metric` under the catalogue entry `name`, with its unit and a help line.
fn register(registry: &mut Registry, name: &str, metric: impl registry::Metric) {
    let spec: &MetricSpec = catalog::find(name).expect("a catalogue metric");
    let help = format!(
        "{} (EMF {}, emitted by the {:?})",
        spec.name,
        spec.unit.as_str(),
        spec.emitter
    );
    match spec.unit {
        Unit::Milliseconds => registry.register_with_unit(
            snake(name),
            help,
            registry::Unit::Other("milliseconds".into()),
            metric,
        ),
        Unit::Seconds => {
            registry.register_with_unit(snake(name), help, registry::Unit::Seconds, metric)
        }
        Unit::Count | Unit::None => registry.register(snake(name), help, metric),
    }
}

impl ServeMetrics {
    pub fn new(
        intake: Arc<IngestMetrics>,
        worker: Arc<WorkerMetrics>,
        relay: Option<Arc<Relay>>,
        sweep: Arc<dyn InboxSweep>,
        destinations: Vec<String>,
    ) -> Self {
        let mut registry = Registry::with_prefix("einmal");
        let series = Series::default();
        let processing_ms = Histogram::new(exponential_buckets(1.0, 2.0, 18));
        let effect_lag_ms = Histogram::new(exponential_buckets(10.0, 2.0, 20));
        // One bucket at 0.5 splits the 0/1 values: `_sum` counts those within the SLI.
        let payment_within_slo = Histogram::new([0.5]);
        let r = &mut registry;
        let s = &series;
        register(r, catalog::WEBHOOKS_ACCEPTED, s.accepted.clone());
        register(r, catalog::WEBHOOKS_DUPLICATE, s.duplicates.clone());
        register(r, catalog::SIGNATURE_FAILURES, s.signature_failures.clone());
        register(r, catalog::WEBHOOKS_REJECTED, s.rejected.clone());
        register(r, catalog::INTAKE_UNAVAILABLE, s.unavailable.clone());
        register(r, catalog::EVENTS_COMPLETED, s.completed.clone());
        register(r, catalog::EVENTS_IGNORED, s.ignored.clone());
        register(r, catalog::DEAD_LETTERS, s.dead_letters.clone());
        register(r, catalog::EVENTS_PARKED, s.parked.clone());
        register(r, catalog::WAITERS_WOKEN, s.woken.clone());
        register(r, catalog::STATE_CONFLICTS, s.conflicts.clone());
        register(r, catalog::RETRIES, s.retries.clone());
        register(r, catalog::PROCESSING_TIME, processing_ms.clone());
        register(r, catalog::EFFECT_LAG, effect_lag_ms.clone());
        register(r, catalog::PAYMENT_WITHIN_SLO, payment_within_slo.clone());
        register(
            r,
            catalog::LOOKUP_CIRCUITS_OPEN,
            s.lookup_circuits_open.clone(),
        );
        register(r, catalog::PENDING_ITEMS, s.pending_items.clone());
        register(r, catalog::OLDEST_PENDING_AGE, s.oldest_pending_age.clone());
        register(r, catalog::WAITING_ITEMS, s.waiting_items.clone());
        register(r, catalog::OLDEST_WAITING_AGE, s.oldest_waiting_age.clone());
        register(r, catalog::DELIVERIES_DELIVERED, s.delivered.clone());
        register(r, catalog::DELIVERIES_FAILED, s.delivery_failed.clone());
        register(
            r,
            catalog::DELIVERIES_DEAD_LETTERED,
            s.delivery_dead_lettered.clone(),
        );
        register(
            r,
            catalog::DELIVERIES_SUPERSEDED,
            s.delivery_superseded.clone(),
        );
        register(r, catalog::DELIVERY_BACKLOG, s.delivery_backlog.clone());
        register(
            r,
            catalog::DELIVERY_BACKLOG_AGE,
            s.delivery_backlog_age.clone(),
        );
        register(
            r,
            catalog::DELIVERY_HELD_OBJECTS,
            s.delivery_held_objects.clone(),
        );
        register(
            r,
            catalog::DELIVERY_DEAD_LETTERS,
            s.delivery_dead_letters.clone(),
        );
        ServeMetrics {
            registry,
            series,
            processing_ms,
            effect_lag_ms,
            payment_within_slo,
            drained: Mutex::new(Drained::default()),
            intake,
            worker,
            relay,
            sweep,
            destinations,
            backlog_read: tokio::sync::Mutex::new(None),
            store: None,
            store_series: StoreSeries::default(),
            store_read: tokio::sync::Mutex::new(None),
        }
    }

    /// Also expose the embedded store's figures (`einmal_store_*`).
    pub fn with_embedded_store(mut self, store: Arc<EmbeddedStore>) -> Self {
        let s = &self.store_series;
        let r = &mut self.registry;
        r.register(
            "store_rows",
            "Rows per table of the embedded store",
            s.rows.clone(),
        );
        r.register_with_unit(
            "store_file",
            "Size of einmal.sqlite",
            registry::Unit::Bytes,
            s.file_bytes.clone(),
        );
        r.register_with_unit(
            "store_wal",
            "Size of einmal.sqlite-wal",
            registry::Unit::Bytes,
            s.wal_bytes.clone(),
        );
        r.register(
            "store_free_pages",
            "Free pages of einmal.sqlite that new rows reuse",
            s.free_pages.clone(),
        );
        r.register_with_unit(
            "store_oldest_item_age",
            "Age of the oldest inbox item",
            registry::Unit::Seconds,
            s.oldest_item_age.clone(),
        );
        r.register_with_unit(
            "store_next_purge",
            "Time until the next retention purge pass",
            registry::Unit::Seconds,
            s.next_purge_in.clone(),
        );
        r.register(
            "store_writes_failing",
            "1 while the store refuses writes (disk full, I/O error)",
            s.writes_failing.clone(),
        );
        self.store = Some(store);
        self
    }

    /// The store's figures as of `now_ms` (see [`STORE_STATS_TTL`]).
    async fn read_store(&self, store: &EmbeddedStore, now_ms: i64) {
        let s = &self.store_series;
        match store.stats().await {
            Ok(stats) => {
                for t in &stats.tables {
                    s.rows
                        .get_or_create(&vec![("table", t.table.clone())])
                        .set(t.rows as i64);
                }
                s.file_bytes.set(stats.file_bytes as i64);
                s.wal_bytes.set(stats.wal_bytes as i64);
                s.free_pages.set(stats.free_pages as i64);
                let age = stats
                    .oldest_item_received_ms
                    .map_or(0, |at| now_ms.saturating_sub(at).max(0) / 1000);
                s.oldest_item_age.set(age);
                let next = stats
                    .next_purge_ms
                    .map_or(0, |at| at.saturating_sub(now_ms).max(0) / 1000);
                s.next_purge_in.set(next);
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read the store's figures"),
        }
    }

    /// Move the processor's and relay's new figures into the series and the log tally.
    fn drain(&self) -> std::sync::MutexGuard<'_, Drained> {
        let mut drained = self.drained.lock().unwrap_or_else(|p| p.into_inner());
        let s = &self.series;
        let intake = self.intake.snapshot();
        let last = drained.intake.as_ref();
        // The intake counts are cumulative: the counters grow by what is new.
        let delta = |field: fn(&IngestCounts) -> u64| {
            field(&intake).saturating_sub(last.map(field).unwrap_or(0))
        };
        s.accepted.inc_by(delta(|c| c.accepted));
        s.duplicates.inc_by(delta(|c| c.duplicates));
        s.signature_failures.inc_by(delta(|c| c.signature_failures));
        s.rejected
            .inc_by(delta(|c| c.malformed + c.not_found + c.oversize));
        s.unavailable.inc_by(delta(|c| c.unavailable));
        drained.intake = Some(intake);

        let worker = self.worker.drain();
        s.completed.inc_by(worker.completed);
        s.ignored.inc_by(worker.ignored);
        s.dead_letters.inc_by(worker.dead_letters);
        s.parked.inc_by(worker.parked);
        s.woken.inc_by(worker.woken);
        s.conflicts.inc_by(worker.conflicts);
        for (cause, n) in &worker.retries {
            s.retries
                .get_or_create(&vec![("cause", cause.as_str().to_string())])
                .inc_by(*n);
        }
        for (provider, open) in &worker.lookup_circuits_open {
            s.lookup_circuits_open
                .get_or_create(&vec![("provider", provider.clone())])
                .set(*open as i64);
        }
        for (histogram, samples) in [
            (&self.processing_ms, &worker.processing_ms),
            (&self.effect_lag_ms, &worker.effect_lag_ms),
            (&self.payment_within_slo, &worker.payment_within_slo),
        ] {
            for v in &samples.values {
                histogram.observe(*v);
            }
        }
        let start = &mut drained.since_start;
        start.completed += worker.completed;
        start.dead_letters += worker.dead_letters;
        // Counted from count and sum, not the values: those are capped per interval.
        start.payments += worker.payment_within_slo.count;
        start.within_slo += worker.payment_within_slo.sum.round() as u64;
        merge_worker(&mut drained.since_log, worker);

        if let Some(relay) = &self.relay {
            let tally = relay.drain_tally();
            for (family, counts) in [
                (&s.delivered, &tally.delivered),
                (&s.delivery_failed, &tally.failed),
                (&s.delivery_dead_lettered, &tally.dead_lettered),
                (&s.delivery_superseded, &tally.superseded),
            ] {
                for (destination, n) in counts {
                    family
                        .get_or_create(&vec![("destination", destination.clone())])
                        .inc_by(*n);
                }
            }
            merge_relay(&mut drained.relay_since_log, tally);
        }
        drained
    }

    /// The worker's and relay's tallies since the last call (for the minute log line).
    pub fn take_since_log(&self) -> (WorkerTally, RelayTally) {
        let mut drained = self.drain();
        (
            std::mem::take(&mut drained.since_log),
            std::mem::take(&mut drained.relay_since_log),
        )
    }

    /// The intake counters and the processor's figures since start (the console's
    /// overview); drains into the same series, so `/metrics` still gets every count.
    pub fn since_start(&self) -> (IngestCounts, Processed) {
        let drained = self.drain();
        (
            drained.intake.unwrap_or_else(|| self.intake.snapshot()),
            drained.since_start,
        )
    }

    /// The backlog gauges as of `now_ms`, read from the store (bounded reads).
    async fn read_backlog(&self, now_ms: i64) {
        let s = &self.series;
        match self.sweep.stuck(now_ms, PENDING_SCAN_MAX).await {
            Ok(pending) => {
                let oldest = pending
                    .iter()
                    .map(|i| now_ms.saturating_sub(i.updated_at_ms))
                    .max()
                    .unwrap_or(0)
                    .max(0);
                s.pending_items.set(pending.len() as i64);
                s.oldest_pending_age.set(oldest / 1000);
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read the pending items"),
        }
        match self
            .sweep
            .waiting(now_ms, 0, einmal::ports::WAITING_SCAN_MAX)
            .await
        {
            Ok(scan) => {
                s.waiting_items.set(scan.count as i64);
                let age = scan
                    .oldest_since_ms
                    .map(|since| now_ms.saturating_sub(since).max(0))
                    .unwrap_or(0);
                s.oldest_waiting_age.set(age / 1000);
            }
            Err(e) => tracing::warn!(error = %e, "metrics: cannot read the waiting items"),
        }
        if let Some(relay) = &self.relay {
            match relay.backlog(now_ms).await {
                Ok(backlog) => {
                    // Every configured destination, zero too, so a dashboard sees recovery.
                    for name in &self.destinations {
                        let (count, age_ms) =
                            backlog.per_destination.get(name).copied().unwrap_or((0, 0));
                        let labels = vec![("destination", name.clone())];
                        s.delivery_backlog.get_or_create(&labels).set(count as i64);
                        s.delivery_backlog_age
                            .get_or_create(&labels)
                            .set(age_ms / 1000);
                        let dead = backlog.dead_letters.get(name).copied().unwrap_or(0);
                        s.delivery_dead_letters
                            .get_or_create(&labels)
                            .set(dead as i64);
                    }
                    s.delivery_held_objects.set(backlog.held_objects as i64);
                }
                Err(e) => tracing::warn!(error = %e, "metrics: cannot read the delivery backlog"),
            }
        }
    }

    /// The whole exposition, as of `now_ms`.
    pub async fn render(&self, now_ms: i64) -> String {
        drop(self.drain());
        {
            let mut last = self.backlog_read.lock().await;
            if last.is_none_or(|at| at.elapsed() >= BACKLOG_TTL) {
                self.read_backlog(now_ms).await;
                *last = Some(Instant::now());
            }
        }
        if let Some(store) = &self.store {
            self.store_series
                .writes_failing
                .set(i64::from(store.writes_failing()));
            let mut last = self.store_read.lock().await;
            if last.is_none_or(|at| at.elapsed() >= STORE_STATS_TTL) {
                self.read_store(store, einmal::adapters::embedded::purge_clock_ms())
                    .await;
                *last = Some(Instant::now());
            }
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics: cannot encode");
        }
        out
    }
}

fn merge_samples(into: &mut Samples, from: Samples) {
    if from.count == 0 {
        return;
    }
    into.max = if into.count == 0 {
        from.max
    } else {
        into.max.max(from.max)
    };
    into.count += from.count;
    into.sum += from.sum;
    // The log line reads count, sum and max only; the values went to the histograms.
}

fn merge_worker(into: &mut WorkerTally, from: WorkerTally) {
    into.completed += from.completed;
    into.ignored += from.ignored;
    into.dead_letters += from.dead_letters;
    into.parked += from.parked;
    into.woken += from.woken;
    into.conflicts += from.conflicts;
    for (cause, n) in from.retries {
        *into.retries.entry(cause).or_default() += n;
    }
    merge_samples(&mut into.processing_ms, from.processing_ms);
    merge_samples(&mut into.effect_lag_ms, from.effect_lag_ms);
    merge_samples(&mut into.payment_within_slo, from.payment_within_slo);
    // A gauge: the latest reading wins.
    into.lookup_circuits_open.extend(from.lookup_circuits_open);
}

fn merge_relay(into: &mut RelayTally, from: RelayTally) {
    let add = |into: &mut BTreeMap<String, u64>, from: BTreeMap<String, u64>| {
        for (k, n) in from {
            *into.entry(k).or_default() += n;
        }
    };
    add(&mut into.delivered, from.delivered);
    add(&mut into.failed, from.failed);
    add(&mut into.dead_lettered, from.dead_lettered);
    add(&mut into.superseded, from.superseded);
}

/// A metrics token that is not fit to guard `/metrics`.
#[derive(Debug, thiserror::Error)]
pub enum MetricsTokenError {
    #[error("the metrics token is empty")]
    Empty,
    #[error("the metrics token is too short (at least {MIN_TOKEN_LEN} characters)")]
    TooShort,
}

/// Check a configured metrics token (at start: a weak one stops `einmal serve`).
pub fn check_token(token: &str) -> Result<(), MetricsTokenError> {
    if token.trim().is_empty() {
        Err(MetricsTokenError::Empty)
    } else if token.len() < MIN_TOKEN_LEN {
        Err(MetricsTokenError::TooShort)
    } else {
        Ok(())
    }
}

#[derive(Clone)]
struct Scrape {
    metrics: Arc<ServeMetrics>,
    /// `Some`: every scrape presents it as a bearer token.
    token: Option<Arc<str>>,
}

/// `GET /metrics`, for `einmal serve`'s router or its own listener.
pub fn routes(metrics: Arc<ServeMetrics>, token: Option<String>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape {
            metrics,
            token: token.map(Arc::from),
        })
}

/// Whether `headers` carry `Authorization: Bearer <expected>` (constant time).
fn authorized(headers: &HeaderMap, expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| {
            let given = given.trim();
            given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
        })
}

async fn scrape(State(scrape): State<Scrape>, headers: HeaderMap) -> Response {
    if let Some(token) = &scrape.token {
        if !authorized(&headers, token) {
            let body = serde_json::json!({
                "error": "unauthorized",
                "message": "/metrics needs Authorization: Bearer <metrics token>",
            })
            .to_string();
            return (
                StatusCode::UNAUTHORIZED,
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::WWW_AUTHENTICATE, "Bearer"),
                ],
                body,
            )
                .into_response();
        }
    }
    let body = scrape.metrics.render(einmal::time::now_millis()).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bearer_token_is_authorized() {
        let token = "metrics-token-0123456789";
        let mut headers = HeaderMap::new();
        assert!(!authorized(&headers, token));
        headers.insert(
            header::AUTHORIZATION,
            "Bearer metrics-token-0123456780".parse().unwrap(),
        );
        assert!(!authorized(&headers, token));
        headers.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        assert!(authorized(&headers, token));
        assert!(check_token("short").is_err());
        assert!(check_token("   ").is_err());
        assert!(check_token(token).is_ok());
    }

    #[test]
    fn catalogue_names_become_prometheus_names() {
        assert_eq!(snake("WebhooksAccepted"), "webhooks_accepted");
        assert_eq!(snake("PaymentWithinSlo"), "payment_within_slo");
        assert_eq!(snake("OldestPendingAge"), "oldest_pending_age");
    }

    #[test]
    fn merged_samples_keep_count_sum_and_max() {
        let mut a = Samples::default();
        a.add(5.0);
        let mut b = Samples::default();
        b.add(2.0);
        b.add(9.0);
        merge_samples(&mut a, b);
        assert_eq!((a.count, a.sum, a.max), (3, 16.0, 9.0));
        merge_samples(&mut a, Samples::default());
        assert_eq!(a.count, 3);
    }
}
