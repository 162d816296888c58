//! Telemetry: metrics in CloudWatch Embedded Metric Format ([`emf`], names from
//! [`catalog`]), redacted JSON logs ([`redact`]), X-Ray trace context ([`trace`]).
//!
//! The intake counters here are plain atomics so the hot path pays a few nanoseconds;
//! `einmal serve` logs them periodically and at shutdown. The Lambda functions print
//! one EMF line per invocation instead.

pub mod catalog;
pub mod emf;
pub mod redact;
pub mod trace;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Thin hints refused by the tenant's intake limit (429).
    pub rate_limited: AtomicU64,
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
    pub rate_limited: u64,
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
            rate_limited: get(&self.rate_limited),
        }
    }
}

/// Crates that log request or event bodies at DEBUG/TRACE (the Lambda runtime logs
/// the raw invocation event, the SDK and hyper whole HTTP exchanges). Their fields are
/// masked by name anyway; capping them at INFO keeps unnamed payload text out too,
/// whatever `RUST_LOG` says.
const PAYLOAD_LOGGERS: &[&str] = &[
    "lambda_runtime",
    "lambda_http",
    "lambda_runtime_api_client",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "aws_smithy_http",
    "aws_smithy_http_client",
    "aws_sdk_dynamodb",
    "aws_sdk_sqs",
    "aws_sdk_ssm",
    "hyper",
    "hyper_util",
    "h2",
    "axum",
];

/// The log filter: `RUST_LOG` (default `info`), with [`PAYLOAD_LOGGERS`] capped at INFO.
pub fn log_filter() -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    cap_payload_loggers(filter)
}

/// `filter` with [`PAYLOAD_LOGGERS`] capped at INFO.
pub fn cap_payload_loggers(
    mut filter: tracing_subscriber::EnvFilter,
) -> tracing_subscriber::EnvFilter {
    for target in PAYLOAD_LOGGERS {
        if let Ok(directive) = format!("{target}=info").parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// The JSON log subscriber writing to `writer`: flat lines, sensitive fields and
/// registered secret values masked ([`redact`]). Tests capture logs with it.
pub fn json_log_subscriber<W>(
    filter: tracing_subscriber::EnvFilter,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .event_format(redact::RedactingJson)
        .fmt_fields(redact::RedactingFields)
        .with_writer(writer)
        .finish()
}

/// JSON logs to stderr, filtered by `RUST_LOG` (default `info`), redacted ([`redact`]).
/// Payloads and secrets are never passed to log macros in this crate; the redaction
/// rule is the safety net for everything else.
pub fn init_json_logs() {
    use tracing_subscriber::util::SubscriberInitExt;
    // `try_init` also routes `log` records (crates that use `log`) through it.
    let _ = json_log_subscriber(log_filter(), std::io::stderr).try_init();
}

/// Log lines captured in memory in the production format (redaction included), for
/// tests that check what reaches the logs.
#[derive(Debug, Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    /// Capture this thread's logs at `level` (e.g. `trace`), the payload-logging
    /// crates capped as in production, until the guard is dropped.
    pub fn install(&self, level: &str) -> tracing::subscriber::DefaultGuard {
        let filter = cap_payload_loggers(tracing_subscriber::EnvFilter::new(level));
        tracing::subscriber::set_default(json_log_subscriber(filter, self.clone()))
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Forget what was captured so far.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
