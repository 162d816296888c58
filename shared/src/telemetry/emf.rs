//! CloudWatch Embedded Metric Format: one JSON line on stdout per invocation, which
//! CloudWatch Logs turns into metrics without a PutMetricData call.
//!
//! A line looks like
//!
//! ```json
//! {"_aws":{"Timestamp":1764457200000,"CloudWatchMetrics":[{"Namespace":"Einmal",
//!  "Dimensions":[["Deployment"],["Deployment","Provider"]],
//!  "Metrics":[{"Name":"WebhooksAccepted","Unit":"Count"},{"Name":"AckLatency","Unit":"Milliseconds"}]}]},
//!  "Deployment":"einmal","Provider":"stripe","WebhooksAccepted":1,"AckLatency":1.234}
//! ```
//!
//! Only names from [`catalog`] are emitted, each with its catalog unit and dimension
//! sets. Counts are summed per invocation and left out when zero (alarms treat missing
//! data as zero); latencies and the SLI are value arrays (at most [`MAX_VALUES`] per
//! line, more values spill into further lines). A dimension value is a top-level key, so
//! one line holds one provider or one cause: a batch whose retries had two causes
//! prints one extra line per further cause.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use thiserror::Error;

use super::catalog::{self, MetricSpec, Unit, DEPLOYMENT};

/// The deployment (stack) name, the `Deployment` dimension of every metric.
pub const DEPLOYMENT_ENV: &str = "EINMAL_DEPLOYMENT";
/// Deployment name when `EINMAL_DEPLOYMENT` is unset or empty.
pub const DEFAULT_DEPLOYMENT: &str = "einmal";
/// The business SLI threshold (provider event time → effect committed), milliseconds.
pub const SLI_THRESHOLD_ENV: &str = "EINMAL_SLI_THRESHOLD_MS";
pub const DEFAULT_SLI_THRESHOLD_MS: i64 = 60_000;
/// EMF allows up to 100 values per metric per line.
pub const MAX_VALUES: usize = 100;
/// Values kept per metric between two drains (an SQS batch holds at most 10,000 records);
/// beyond it only count, sum and max are kept (the local loop of `einmal serve`).
const MAX_KEPT_VALUES: usize = 10_000;

/// `EINMAL_DEPLOYMENT`, or `einmal`.
pub fn deployment_from_env() -> String {
    std::env::var(DEPLOYMENT_ENV)
        .ok()
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_DEPLOYMENT.to_string())
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{SLI_THRESHOLD_ENV}: {0:?} is not a positive number of milliseconds")]
pub struct ThresholdError(pub String);

/// `EINMAL_SLI_THRESHOLD_MS`, or 60,000.
pub fn sli_threshold_ms_from_env() -> Result<i64, ThresholdError> {
    sli_threshold_ms_from(std::env::var(SLI_THRESHOLD_ENV).ok())
}

/// [`sli_threshold_ms_from_env`] with the raw value given (tests).
pub fn sli_threshold_ms_from(raw: Option<String>) -> Result<i64, ThresholdError> {
    match raw.filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_SLI_THRESHOLD_MS),
        Some(v) => match v.trim().parse::<i64>() {
            Ok(ms) if ms > 0 => Ok(ms),
            _ => Err(ThresholdError(v)),
        },
    }
}

/// Print lines to stdout in one write each (Lambda ships stdout to CloudWatch Logs).
pub fn print(lines: &[String]) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    for line in lines {
        // A closed stdout only loses metrics; never fail the invocation for it.
        let _ = out.write_all(line.as_bytes());
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

#[derive(Debug, Clone)]
struct Entry {
    spec: &'static MetricSpec,
    /// The value of the metric's breakdown dimension (provider, cause), if any.
    breakdown: Option<String>,
    values: Vec<f64>,
}

/// The metrics of one invocation, rendered to EMF lines by [`Emf::render`].
#[derive(Debug, Clone)]
pub struct Emf {
    deployment: String,
    timestamp_ms: i64,
    entries: Vec<Entry>,
}

impl Emf {
    pub fn new(deployment: &str, timestamp_ms: i64) -> Self {
        Emf {
            deployment: deployment.to_string(),
            timestamp_ms,
            entries: Vec::new(),
        }
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Record `value` of metric `name` (a [`catalog`] constant) with the deployment
    /// dimension only. Counts add up; other units collect values.
    pub fn put(&mut self, name: &'static str, value: f64) {
        self.record(name, None, value);
    }

    /// Record `value` also under the metric's breakdown dimension (`Provider`,
    /// `Cause`) with value `by`. A metric without a breakdown ignores `by`.
    pub fn put_by(&mut self, name: &'static str, by: &str, value: f64) {
        self.record(name, Some(by), value);
    }

    /// A count, left out when zero.
    pub fn count(&mut self, name: &'static str, n: u64) {
        if n > 0 {
            self.put(name, n as f64);
        }
    }

    /// A count by breakdown, left out when zero.
    pub fn count_by(&mut self, name: &'static str, by: &str, n: u64) {
        if n > 0 {
            self.put_by(name, by, n as f64);
        }
    }

    fn record(&mut self, name: &'static str, by: Option<&str>, value: f64) {
        let Some(spec) = catalog::find(name) else {
            debug_assert!(false, "metric {name} is not in the catalog");
            return;
        };
        if !value.is_finite() {
            return;
        }
        let by = by.filter(|_| breakdown_dimension(spec).is_some());
        let existing = self
            .entries
            .iter_mut()
            .find(|e| e.spec.name == name && e.breakdown.as_deref() == by);
        match existing {
            Some(e) if spec.unit == Unit::Count => e.values[0] += value,
            Some(e) => e.values.push(value),
            None => self.entries.push(Entry {
                spec,
                breakdown: by.map(str::to_string),
                values: vec![value],
            }),
        }
    }

    /// The EMF lines (no trailing newline); empty when nothing was recorded.
    pub fn render(&self) -> Vec<String> {
        // One document per breakdown value; deployment-only entries join the first.
        let mut groups: Vec<(Option<Breakdown<'_>>, Vec<&Entry>)> = Vec::new();
        let mut plain: Vec<&Entry> = Vec::new();
        for entry in &self.entries {
            let key = match (&entry.breakdown, breakdown_dimension(entry.spec)) {
                (Some(value), Some(dim)) => (dim, value.as_str()),
                _ => {
                    plain.push(entry);
                    continue;
                }
            };
            match groups.iter_mut().find(|(k, _)| *k == Some(key)) {
                Some((_, list)) => list.push(entry),
                None => groups.push((Some(key), vec![entry])),
            }
        }
        match groups.first_mut() {
            Some((_, list)) => list.extend(plain),
            None if !plain.is_empty() => groups.push((None, plain)),
            None => {}
        }
        let mut lines = Vec::new();
        for (key, entries) in &groups {
            let chunks = entries
                .iter()
                .map(|e| e.values.len().div_ceil(MAX_VALUES))
                .max()
                .unwrap_or(0);
            for chunk in 0..chunks {
                let part: Vec<(&Entry, &[f64])> = entries
                    .iter()
                    .filter_map(|e| {
                        e.values
                            .chunks(MAX_VALUES)
                            .nth(chunk)
                            .map(|values| (*e, values))
                    })
                    .collect();
                lines.push(self.render_line(*key, &part));
            }
        }
        lines
    }

    fn render_line(&self, key: Option<Breakdown<'_>>, part: &[(&Entry, &[f64])]) -> String {
        let mut out = String::with_capacity(320);
        let _ = write!(
            out,
            "{{\"_aws\":{{\"Timestamp\":{},\"CloudWatchMetrics\":[",
            self.timestamp_ms
        );
        // One directive per distinct dimension-set list, metrics in recording order.
        let mut directives: Vec<(&'static [&'static [&'static str]], Vec<&Entry>)> = Vec::new();
        for (entry, _) in part {
            let sets = if entry.breakdown.is_some() {
                entry.spec.dimension_sets
            } else {
                DEPLOYMENT_ONLY
            };
            match directives.iter_mut().find(|(s, _)| *s == sets) {
                Some((_, list)) => list.push(entry),
                None => directives.push((sets, vec![entry])),
            }
        }
        for (i, (sets, entries)) in directives.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"Namespace\":");
            push_json_str(&mut out, catalog::NAMESPACE);
            out.push_str(",\"Dimensions\":[");
            for (j, set) in sets.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push('[');
                for (k, dim) in set.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    push_json_str(&mut out, dim);
                }
                out.push(']');
            }
            out.push_str("],\"Metrics\":[");
            for (j, entry) in entries.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str("{\"Name\":");
                push_json_str(&mut out, entry.spec.name);
                out.push_str(",\"Unit\":");
                push_json_str(&mut out, entry.spec.unit.as_str());
                out.push('}');
            }
            out.push_str("]}");
        }
        out.push_str("]},");
        push_json_str(&mut out, DEPLOYMENT);
        out.push(':');
        push_json_str(&mut out, &self.deployment);
        if let Some((dim, value)) = key {
            out.push(',');
            push_json_str(&mut out, dim);
            out.push(':');
            push_json_str(&mut out, value);
        }
        for (entry, values) in part {
            out.push(',');
            push_json_str(&mut out, entry.spec.name);
            out.push(':');
            match values {
                [one] => push_number(&mut out, *one),
                many => {
                    out.push('[');
                    for (j, v) in many.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        push_number(&mut out, *v);
                    }
                    out.push(']');
                }
            }
        }
        out.push('}');
        out
    }
}

const DEPLOYMENT_ONLY: &[&[&str]] = &[&[DEPLOYMENT]];

/// A breakdown dimension and its value (`Provider` = `stripe`).
type Breakdown<'a> = (&'static str, &'a str);

/// The second dimension of a metric's breakdown set (`Provider`, `Cause`), if it has one.
fn breakdown_dimension(spec: &MetricSpec) -> Option<&'static str> {
    spec.dimension_sets
        .iter()
        .find(|set| set.len() == 2)
        .map(|set| set[1])
}

/// Integers without a fraction, others rounded to microseconds (3 decimals).
fn push_number(out: &mut String, v: f64) {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{}", (v * 1000.0).round() / 1000.0);
    }
}

/// A JSON string literal.
pub(crate) fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------
// What each function records
// ---------------------------------------------------------------------------------

/// The intake result of one webhook request (receiver: one EMF line per request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IntakeResult {
    /// Stored: `new` events inserted, `duplicates` already in the inbox.
    Accepted { new: u32, duplicates: u32 },
    /// Signature missing, wrong, stale, or tenant mismatch (401).
    SignatureFailure,
    /// Malformed, unknown provider/tenant, method, oversize (4xx other than 401).
    #[default]
    Rejected,
    /// Store or queue failed (503).
    Unavailable,
}

/// What the receiver measured for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntakeRecord {
    /// The provider's name when it is a known provider, so a path cannot invent
    /// dimension values (each one is a billed custom metric); `unknown` otherwise.
    pub provider: &'static str,
    pub result: IntakeResult,
    /// From the start of the request to the answer, milliseconds.
    pub ack_ms: f64,
}

/// Provider dimension value of unknown providers.
pub const UNKNOWN_PROVIDER: &str = "unknown";

impl IntakeRecord {
    /// The metrics of this request.
    pub fn emf(&self, deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        let p = self.provider;
        match self.result {
            IntakeResult::Accepted { new, duplicates } => {
                emf.count_by(catalog::WEBHOOKS_ACCEPTED, p, u64::from(new));
                emf.count_by(catalog::WEBHOOKS_DUPLICATE, p, u64::from(duplicates));
            }
            IntakeResult::SignatureFailure => emf.count_by(catalog::SIGNATURE_FAILURES, p, 1),
            IntakeResult::Rejected => emf.count_by(catalog::WEBHOOKS_REJECTED, p, 1),
            IntakeResult::Unavailable => emf.count(catalog::INTAKE_UNAVAILABLE, 1),
        }
        emf.put_by(catalog::ACK_LATENCY, p, self.ack_ms);
        emf
    }
}

/// Why a processing attempt will be retried: the `Cause` dimension of `Retries`. A
/// closed set, so the number of custom metrics stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetryCause {
    /// The store (inbox or business state) or queue was unavailable.
    StoreUnavailable,
    /// A prerequisite is missing (refund before payment): the domain waits.
    Prerequisite,
    /// Concurrent writers kept changing the records (version conflicts).
    Contention,
    /// The provider API of a thin webhook failed transiently.
    Lookup,
    /// The processing code panicked.
    Panic,
}

impl RetryCause {
    pub const ALL: [RetryCause; 5] = [
        RetryCause::StoreUnavailable,
        RetryCause::Prerequisite,
        RetryCause::Contention,
        RetryCause::Lookup,
        RetryCause::Panic,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RetryCause::StoreUnavailable => "store_unavailable",
            RetryCause::Prerequisite => "prerequisite",
            RetryCause::Contention => "contention",
            RetryCause::Lookup => "lookup",
            RetryCause::Panic => "panic",
        }
    }
}

/// Count, sum, max, and the values themselves up to a cap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    pub count: u64,
    pub sum: f64,
    pub max: f64,
    pub values: Vec<f64>,
}

impl Samples {
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.count += 1;
        self.sum += v;
        self.max = if self.count == 1 { v } else { self.max.max(v) };
        if self.values.len() < MAX_KEPT_VALUES {
            self.values.push(v);
        }
    }
}

/// What the processor did since the last [`WorkerMetrics::drain`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerTally {
    pub completed: u64,
    pub ignored: u64,
    pub dead_letters: u64,
    /// Events parked (state `waiting`) for a prerequisite.
    pub parked: u64,
    /// Parked events re-enqueued after a commit changed what they wait on.
    pub woken: u64,
    /// Commits that found a record changed since its load (each decided again).
    pub conflicts: u64,
    pub retries: BTreeMap<RetryCause, u64>,
    /// Claim → finish of each claimed message, milliseconds.
    pub processing_ms: Samples,
    /// Provider event time → effect committed, milliseconds.
    pub effect_lag_ms: Samples,
    /// 1 or 0 per payment event (effect within the SLI threshold or not).
    pub payment_within_slo: Samples,
    /// Provider → its tenants' open lookup circuits, as of the batch's last lookup.
    pub lookup_circuits_open: BTreeMap<String, u64>,
}

impl WorkerTally {
    pub fn retries_total(&self) -> u64 {
        self.retries.values().sum()
    }

    /// The metrics of one batch.
    pub fn emf(&self, deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        emf.count(catalog::EVENTS_COMPLETED, self.completed);
        emf.count(catalog::EVENTS_IGNORED, self.ignored);
        emf.count(catalog::DEAD_LETTERS, self.dead_letters);
        emf.count(catalog::EVENTS_PARKED, self.parked);
        emf.count(catalog::WAITERS_WOKEN, self.woken);
        emf.count(catalog::STATE_CONFLICTS, self.conflicts);
        for (cause, n) in &self.retries {
            emf.count_by(catalog::RETRIES, cause.as_str(), *n);
        }
        for v in &self.processing_ms.values {
            emf.put(catalog::PROCESSING_TIME, *v);
        }
        for v in &self.effect_lag_ms.values {
            emf.put(catalog::EFFECT_LAG, *v);
        }
        for v in &self.payment_within_slo.values {
            emf.put(catalog::PAYMENT_WITHIN_SLO, *v);
        }
        // A gauge: zero too, so a closed circuit shows as closed.
        for (provider, open) in &self.lookup_circuits_open {
            emf.put_by(catalog::LOOKUP_CIRCUITS_OPEN, provider, *open as f64);
        }
        emf
    }
}

/// The processor's tally, shared by its concurrent messages.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    tally: Mutex<WorkerTally>,
}

impl WorkerMetrics {
    /// Change the tally under its lock (a poisoned lock still counts).
    pub fn update(&self, f: impl FnOnce(&mut WorkerTally)) {
        let mut guard = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard);
    }

    /// The tally so far, and a fresh one from now on.
    pub fn drain(&self) -> WorkerTally {
        let mut guard = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *guard)
    }
}

/// The sweeper's figures of one pass (the backlog gauges are always emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepFigures {
    pub pending_items: u64,
    pub oldest_pending_age_ms: i64,
    pub stuck_items: u64,
    pub reenqueued: u64,
    pub leases_released: u64,
    pub dead_letters_marked: u64,
    pub waiting_items: u64,
    pub oldest_waiting_age_ms: i64,
    pub waiters_rechecked: u64,
}

impl SweepFigures {
    pub fn emf(&self, deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        emf.put(catalog::PENDING_ITEMS, self.pending_items as f64);
        emf.put(
            catalog::OLDEST_PENDING_AGE,
            self.oldest_pending_age_ms.max(0) as f64 / 1000.0,
        );
        emf.put(catalog::STUCK_ITEMS, self.stuck_items as f64);
        emf.put(catalog::SWEEP_REENQUEUED, self.reenqueued as f64);
        emf.put(catalog::LEASES_RELEASED, self.leases_released as f64);
        emf.put(
            catalog::DEAD_LETTERS_MARKED,
            self.dead_letters_marked as f64,
        );
        emf.put(catalog::WAITING_ITEMS, self.waiting_items as f64);
        emf.put(
            catalog::OLDEST_WAITING_AGE,
            self.oldest_waiting_age_ms.max(0) as f64 / 1000.0,
        );
        emf.put(catalog::WAITERS_RECHECKED, self.waiters_rechecked as f64);
        emf
    }
}

/// The reconciler's figures of one run (always emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReconcileFigures {
    pub ingested: u64,
    pub differences: u64,
    pub failures: u64,
}

impl ReconcileFigures {
    pub fn emf(&self, deployment: &str, timestamp_ms: i64) -> Emf {
        let mut emf = Emf::new(deployment, timestamp_ms);
        emf.put(catalog::RECONCILE_INGESTED, self.ingested as f64);
        emf.put(catalog::RECONCILE_DIFFERENCES, self.differences as f64);
        emf.put(catalog::RECONCILE_FAILURES, self.failures as f64);
        emf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Parse a line back and check it against the catalog: every metric is declared
    /// with its catalog unit, under dimension sets the catalog allows, and every
    /// dimension and metric has its top-level value.
    fn check(line: &str) -> Value {
        let doc: Value = serde_json::from_str(line).expect("valid JSON");
        let aws = &doc["_aws"];
        assert!(aws["Timestamp"].as_i64().is_some(), "{line}");
        let directives = aws["CloudWatchMetrics"].as_array().expect("directives");
        assert!(!directives.is_empty());
        for d in directives {
            assert_eq!(d["Namespace"], catalog::NAMESPACE);
            let sets: Vec<Vec<String>> =
                serde_json::from_value(d["Dimensions"].clone()).expect("dimension sets");
            for set in &sets {
                for dim in set {
                    assert!(doc[dim].is_string(), "dimension {dim} has no value: {line}");
                }
            }
            for m in d["Metrics"].as_array().expect("metrics") {
                let name = m["Name"].as_str().expect("name");
                let spec = catalog::find(name).unwrap_or_else(|| panic!("{name} not in catalog"));
                assert_eq!(m["Unit"], spec.unit.as_str(), "{name}");
                for set in &sets {
                    assert!(
                        spec.dimension_sets.iter().any(|s| s == set),
                        "{name} published under {set:?}, not in the catalog"
                    );
                }
                let v = &doc[name];
                let values = v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]);
                assert!(!values.is_empty() && values.len() <= MAX_VALUES, "{name}");
                assert!(values.iter().all(Value::is_number), "{name}: {v}");
            }
        }
        doc
    }

    #[test]
    fn intake_line_has_the_catalog_shape() {
        let record = IntakeRecord {
            provider: "stripe",
            result: IntakeResult::Accepted {
                new: 1,
                duplicates: 0,
            },
            ack_ms: 1.23456,
        };
        let lines = record.emf("prod-eu", 1_764_457_200_000).render();
        assert_eq!(lines.len(), 1);
        let doc = check(&lines[0]);
        assert_eq!(doc["Deployment"], "prod-eu");
        assert_eq!(doc["Provider"], "stripe");
        assert_eq!(doc["WebhooksAccepted"], 1);
        assert_eq!(doc["AckLatency"], 1.235);
        assert!(
            doc.get("WebhooksDuplicate").is_none(),
            "zero counts are left out"
        );
        assert_eq!(doc["_aws"]["Timestamp"], 1_764_457_200_000i64);
        let dims = &doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"];
        assert_eq!(
            dims,
            &serde_json::json!([["Deployment"], ["Deployment", "Provider"]])
        );
        assert!(lines[0].len() < 340, "{} bytes", lines[0].len());

        let unavailable = IntakeRecord {
            provider: "github",
            result: IntakeResult::Unavailable,
            ack_ms: 20.0,
        };
        let doc = check(&unavailable.emf("einmal", 1).render()[0]);
        assert_eq!(doc["IntakeUnavailable"], 1);
        assert_eq!(doc["AckLatency"], 20);
        // IntakeUnavailable is deployment-only; AckLatency by provider: two directives.
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn worker_batch_aggregates_and_splits_causes_and_long_arrays() {
        let mut t = WorkerTally {
            completed: 150,
            ignored: 2,
            dead_letters: 1,
            ..Default::default()
        };
        t.retries.insert(RetryCause::Prerequisite, 2);
        t.retries.insert(RetryCause::StoreUnavailable, 1);
        for i in 0..150 {
            t.processing_ms.add(f64::from(i));
        }
        t.effect_lag_ms.add(1500.0);
        t.payment_within_slo.add(1.0);
        t.payment_within_slo.add(0.0);
        let lines = t.emf("einmal", 5).render();
        // cause store_unavailable (first in order) with everything else, 150 values →
        // two lines; cause prerequisite on its own line
        assert_eq!(lines.len(), 3, "{lines:#?}");
        let docs: Vec<Value> = lines.iter().map(|l| check(l)).collect();
        assert_eq!(docs[0]["Cause"], "store_unavailable");
        assert_eq!(docs[0]["Retries"], 1);
        assert_eq!(docs[0]["EventsCompleted"], 150);
        assert_eq!(docs[0]["ProcessingTime"].as_array().unwrap().len(), 100);
        assert_eq!(docs[0]["PaymentWithinSlo"], serde_json::json!([1, 0]));
        assert_eq!(docs[0]["EffectLag"], 1500);
        assert_eq!(docs[1]["ProcessingTime"].as_array().unwrap().len(), 50);
        assert!(
            docs[1].get("EventsCompleted").is_none(),
            "a count is emitted once"
        );
        assert_eq!(docs[2]["Cause"], "prerequisite");
        assert_eq!(docs[2]["Retries"], 2);
        let total: f64 = docs
            .iter()
            .filter_map(|d| d["ProcessingTime"].as_array())
            .flatten()
            .filter_map(Value::as_f64)
            .sum();
        assert_eq!(total, (0..150).sum::<i32>() as f64);
        assert!(WorkerTally::default().emf("einmal", 1).render().is_empty());
    }

    #[test]
    fn sweep_and_reconcile_always_report_every_gauge() {
        let figures = SweepFigures {
            pending_items: 3,
            oldest_pending_age_ms: 90_500,
            stuck_items: 2,
            reenqueued: 1,
            leases_released: 1,
            dead_letters_marked: 0,
            waiting_items: 4,
            oldest_waiting_age_ms: 7_200_000,
            waiters_rechecked: 0,
        };
        let lines = figures.emf("einmal", 1).render();
        assert_eq!(lines.len(), 1);
        let doc = check(&lines[0]);
        assert_eq!(doc["OldestPendingAge"], 90.5);
        assert_eq!(doc["DeadLettersMarked"], 0);
        assert_eq!(doc["StuckItems"], 2);
        assert_eq!(doc["WaitingItems"], 4);
        assert_eq!(doc["OldestWaitingAge"], 7200.0);
        assert_eq!(doc["WaitersRechecked"], 0);
        let doc = check(&ReconcileFigures::default().emf("einmal", 1).render()[0]);
        for name in [
            catalog::RECONCILE_INGESTED,
            catalog::RECONCILE_DIFFERENCES,
            catalog::RECONCILE_FAILURES,
        ] {
            assert_eq!(doc[name], 0, "{name}");
        }
    }

    #[test]
    fn every_catalog_metric_can_be_emitted_and_nothing_else() {
        let mut emf = Emf::new("d\"quoted\"\n", 1);
        for spec in catalog::CATALOG {
            emf.put_by(spec.name, "x", 1.5);
            emf.put(spec.name, 2.0);
        }
        let names: Vec<&str> = emf.entries.iter().map(|e| e.spec.name).collect();
        for spec in catalog::CATALOG {
            assert!(names.contains(&spec.name), "{}", spec.name);
        }
        for line in emf.render() {
            let doc = check(&line);
            assert_eq!(doc["Deployment"], "d\"quoted\"\n");
        }
        assert!(!emf.is_empty());
    }

    #[test]
    fn threshold_from_env_values() {
        assert_eq!(sli_threshold_ms_from(None), Ok(60_000));
        assert_eq!(sli_threshold_ms_from(Some(" ".into())), Ok(60_000));
        assert_eq!(sli_threshold_ms_from(Some("1500".into())), Ok(1500));
        assert!(sli_threshold_ms_from(Some("0".into())).is_err());
        assert!(sli_threshold_ms_from(Some("soon".into())).is_err());
    }

    #[test]
    fn samples_keep_count_sum_and_max() {
        let mut s = Samples::default();
        for v in [3.0, f64::NAN, 1.0, 7.0] {
            s.add(v);
        }
        assert_eq!((s.count, s.sum, s.max), (3, 11.0, 7.0));
        assert_eq!(s.values, vec![3.0, 1.0, 7.0]);
    }
}
