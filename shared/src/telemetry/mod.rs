//! Counters for the intake path and log setup.
//!
//! Counters are plain atomics so the hot path pays a few nanoseconds; the Lambda
//! functions publish them as CloudWatch metrics, `einmal serve` on shutdown.

pub mod catalog;

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub struct IngestMetrics {
    pub accepted: AtomicU64,
    pub duplicates: AtomicU64,
    pub reenqueued: AtomicU64,
    pub signature_failures: AtomicU64,
    pub malformed: AtomicU64,
    pub not_found: AtomicU64,
    pub oversize: AtomicU64,
    pub unavailable: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IngestCounts {
    pub accepted: u64,
    pub duplicates: u64,
    pub reenqueued: u64,
    pub signature_failures: u64,
    pub malformed: u64,
    pub not_found: u64,
    pub oversize: u64,
    pub unavailable: u64,
}

impl IngestMetrics {
    pub fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> IngestCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IngestCounts {
            accepted: get(&self.accepted),
            duplicates: get(&self.duplicates),
            reenqueued: get(&self.reenqueued),
            signature_failures: get(&self.signature_failures),
            malformed: get(&self.malformed),
            not_found: get(&self.not_found),
            oversize: get(&self.oversize),
            unavailable: get(&self.unavailable),
        }
    }
}

/// JSON logs to stderr, filtered by `RUST_LOG` (default `info`). Payloads and secrets
/// are never passed to log macros in this crate; only ids and outcomes are.
pub fn init_json_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .try_init();
}
